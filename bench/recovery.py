"""Part 4, recovery: a coordinator (re)start on a full log, until gRPC health is SERVING and the backlog is committed.

The log is written directly with SQL: `sinks` sinks over `tables` Iceberg tables, `epochs_per_sink` epochs
each (so sinks x epochs rows), the last `pending_per_sink` of them PENDING at or below the recorded
checkpoint (a coordinator that died after recording checkpoints, before committing them), the rest COMMITTED.
Pending epochs are empty, except on `file_sinks` sinks (one per table) whose pending epochs carry one small
Parquet file each: those need a real Iceberg append at start-up.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
from pyiceberg.catalog import load_catalog

from bench.infra import ORDERS, Coordinator, Postgres, py_spy, spread, write_orders_file
from coordinator_service.log import precommit_metadata
from coordinator_service.log.database import libpq_url
from coordinator_service.log.precommit_metadata import PreCommitMetadata
from coordinator_service.tables.iceberg import IcebergGateway

BACKLOG_SQL = """
SELECT count(*) FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id
WHERE p.status = 'PENDING' AND p.epoch <= s.checkpointed_epoch
"""


def build_log(
    postgres: Postgres,
    root: Path,
    *,
    sinks: int,
    epochs_per_sink: int,
    pending_per_sink: int,
    tables: int,
    file_sinks: int,
) -> tuple[str, Path]:
    database_url = postgres.new_database("recovery")
    data_dir = root / f"recovery-{time.monotonic_ns()}"
    warehouse = data_dir / "warehouse"
    warehouse.mkdir(parents=True)
    catalog = load_catalog("default", type="sql", uri=database_url, warehouse=warehouse.as_uri())
    tables_ = IcebergGateway(catalog)
    identifiers = [f"bench.rec{t}" for t in range(tables)]
    for identifier in identifiers:
        tables_.ensure_table(identifier, ORDERS, ())
    checkpoint = epochs_per_sink - 1
    committed = checkpoint - pending_per_sink
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute(
            "INSERT INTO sinks (name, table_identifier, catalog, checkpointed_epoch, committed_epoch, writer_term)"
            " SELECT 'r' || i, 'bench.rec' || (i %% %s), 'default', %s, %s, 1 FROM generate_series(0, %s - 1) i",
            (tables, checkpoint, committed, sinks),
        )
        # Each sink's own table among its tables, as registration records it (the commit holds a sink to them).
        connection.execute(
            "INSERT INTO sink_tables (sink_id, table_identifier, committed_epoch)"
            " SELECT id, table_identifier, committed_epoch FROM sinks"
        )
        for identifier in identifiers:
            empty = precommit_metadata.encode(PreCommitMetadata(table=identifier, data_files=()))
            connection.execute(
                "INSERT INTO pending_sink_state (sink_id, epoch, status, metadata, attempt, file_count,"
                " record_count, files_cleaned)"
                " SELECT s.id, e, (CASE WHEN e <= %s THEN 'COMMITTED' ELSE 'PENDING' END)::epoch_status, %s, 1, 0, 0,"
                " false FROM sinks s, generate_series(0, %s - 1) e WHERE s.table_identifier = %s",
                (committed, empty, epochs_per_sink, identifier),
            )
        for index in range(file_sinks):
            identifier = identifiers[index % tables]
            location = catalog.load_table(identifier).location()
            for epoch in range(committed + 1, checkpoint + 1):
                uri = write_orders_file(location, 100, first=epoch * 100)
                entries = tables_.read_data_files(identifier, [uri], 0, False).entries
                encoded = precommit_metadata.encode(PreCommitMetadata(table=identifier, data_files=tuple(entries)))
                connection.execute(
                    "UPDATE pending_sink_state SET metadata = %s, file_count = 1, record_count = 100"
                    " WHERE sink_id = (SELECT id FROM sinks WHERE name = %s) AND epoch = %s",
                    (encoded, f"r{index}", epoch),
                )
                # The file claimed by its epoch's attempt, as a pre-commit claims it (path_claims).
                connection.execute(
                    "INSERT INTO epoch_files (path, sink_id, epoch, attempt)"
                    " SELECT %s, id, %s, 1 FROM sinks WHERE name = %s",
                    (entries[0].path, epoch, f"r{index}"),
                )
        connection.execute("VACUUM ANALYZE")
    return database_url, data_dir


def backlog(database_url: str) -> int:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        row = connection.execute(BACKLOG_SQL).fetchone()
    return int(row[0]) if row else 0


def measure_restart(
    database_url: str, data_dir: Path, profile: Path | None, timeout: float = 120.0
) -> dict[str, float]:
    coordinator = Coordinator(database_url, data_dir)
    coordinator.start(wait=False)
    try:
        with py_spy(coordinator.pid, profile or Path("unused"), profile is not None):
            serving = coordinator.wait_serving()
            with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
                while True:
                    row = connection.execute(BACKLOG_SQL).fetchone()
                    if row is not None and int(row[0]) == 0:
                        break
                    if time.monotonic() - coordinator.started_at > timeout:
                        raise RuntimeError(f"backlog not committed in {timeout} s; see {coordinator.log_path}")
                    time.sleep(0.02)
            ready = time.monotonic() - coordinator.started_at
    finally:
        coordinator.stop()
    return {"serving_s": serving, "ready_s": ready}


def run(
    postgres: Postgres,
    root: Path,
    *,
    sinks: int,
    rows: int,
    pending_per_sink: int,
    tables: int,
    file_sinks: int,
    repetitions: int,
    profile: Path | None,
) -> dict[str, Any]:
    epochs_per_sink = rows // sinks
    runs = []
    for repetition in range(repetitions):
        database_url, data_dir = build_log(
            postgres,
            root,
            sinks=sinks,
            epochs_per_sink=epochs_per_sink,
            pending_per_sink=pending_per_sink,
            tables=tables,
            file_sinks=file_sinks,
        )
        pending = backlog(database_url)
        runs.append(
            {"pending": pending, **measure_restart(database_url, data_dir, profile if repetition == 0 else None)}
        )
    return {
        "sinks": sinks,
        "rows": sinks * epochs_per_sink,
        "pending_rows": runs[0]["pending"],
        "tables": tables,
        "file_sinks": file_sinks,
        "serving_s": spread([run["serving_s"] for run in runs]),
        "ready_s": spread([run["ready_s"] for run in runs]),
        "runs": runs,
        "last_database_url": database_url,
        "last_data_dir": str(data_dir),
    }
