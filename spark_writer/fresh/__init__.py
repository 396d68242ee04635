"""Fresh reads: a sink's table as it will be once the records already in Kafka are committed, read now.

``read_arrow`` gives a pyarrow Table (pyiceberg reads the table, confluent-kafka the tail: no Spark session), for
pyiceberg and DuckDB users; ``read`` the same rows as a Spark DataFrame. Both take the sink's name, the
coordinator's gRPC address, a pyiceberg catalog of the sink's tables, and the writer's flags that say where the
records are and how the sink decodes and routes them (sink_flags), under the names of `sink-writer`'s parameters.
fresh_read says how; docs/spark-writer.md ("Fresh reads") what the result guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

from coordinator_service.contract.client import CoordinatorClient
from spark_writer.fresh.fresh_read import checked_arguments, fresh_table
from spark_writer.fresh.sink_flags import SinkFlags, sink_source
from spark_writer.sink.sink_arguments import DEFAULT_COORDINATOR_RETRY_SECONDS

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SinkFlags", "read", "read_arrow"]


def read_arrow(
    *,
    sink: str,
    coordinator: str,
    catalog: Catalog,
    table: str | None = None,
    writer_token: str | None = None,
    coordinator_retry_seconds: float = DEFAULT_COORDINATOR_RETRY_SECONDS,
    **flags: Unpack[SinkFlags],
) -> pa.Table:
    """The sink's table at its newest snapshot plus the topic's records after that snapshot's end offsets, up to
    the latest offsets when the read began, decoded and routed as the sink does, each record once; for an upsert or
    change stream, the tail's last version of a key replaces the table's row (a deleted key's is removed).

    Args:
        sink: the sink's name.
        coordinator: the coordinator's gRPC address (the writer's --coordinator).
        catalog: a pyiceberg catalog holding the sink's tables.
        table: which of the sink's tables (fan-out); default: its own.
        writer_token: the coordinator's writer token, when it has one.
        coordinator_retry_seconds: how long GetSinkState is retried while the coordinator is unreachable.
        flags: the writer's flags (SinkFlags): bootstrap_servers and topic, and any of the others the sink runs with.

    Returns the rows; their schema's metadata holds `sink-coordinator.kafka.end-offsets` (where the read ends in each
    partition) and `sink-coordinator.snapshot-id` (the snapshot the table was read at).

    Raises ValueError for a bad argument or flags that are not the sink's (fresh_read.SinkMismatchError),
    table_head.TableHeadError when the table's snapshots cannot say which records it holds, DataLossError for
    records deleted before the sink read them (unless fail_on_data_loss=False), BadRecordError and
    UnroutedRecordsError where the sink's batch would fail, and CoordinatorRpcError when the coordinator refuses.
    """
    address = checked_arguments(sink, coordinator, catalog, table, writer_token, coordinator_retry_seconds)
    source = sink_source(flags)
    with CoordinatorClient(address, token=writer_token, retry_seconds=coordinator_retry_seconds) as client:
        return fresh_table(source, catalog, client, sink, table)


def read(
    spark: SparkSession,
    *,
    sink: str,
    coordinator: str,
    catalog: Catalog,
    table: str | None = None,
    writer_token: str | None = None,
    coordinator_retry_seconds: float = DEFAULT_COORDINATOR_RETRY_SECONDS,
    **flags: Unpack[SinkFlags],
) -> DataFrame:
    """``read_arrow``'s rows as a DataFrame of `spark` (its arguments and errors are read_arrow's). The rows are read
    and merged in the driver, as read_arrow reads them, then handed to Spark."""
    rows = read_arrow(
        sink=sink,
        coordinator=coordinator,
        catalog=catalog,
        table=table,
        writer_token=writer_token,
        coordinator_retry_seconds=coordinator_retry_seconds,
        **flags,
    )
    return spark.createDataFrame(rows)
