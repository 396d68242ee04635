"""Reading a streaming query's own checkpoint: which batches Spark has committed, and their offsets.

Spark writes ``<checkpoint>/offsets/N`` before it runs batch N and
``<checkpoint>/commits/N`` once the batch's sink succeeded (an atomic rename:
the file exists whole or not at all). ``commits/`` is therefore the truth of
what Spark will never run again: the writer registers with its highest batch
id, and reports it to the coordinator as the checkpointed epoch.

The files are read through Hadoop's FileSystem in the driver's JVM, so that
every checkpoint location Spark itself can use (local, HDFS, s3a://, abfss://)
works, resolved exactly as Spark resolves it.
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import SparkSession

NO_BATCH: Final = -1
COMMITS: Final = "commits"
OFFSETS: Final = "offsets"
# What Spark's offset log holds for a source with no offset in a batch.
NO_OFFSET: Final = "-"


class SparkCheckpoint:
    """The commit and offset logs of one checkpoint location, on the driver."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        jvm: Any = spark.sparkContext._jvm
        hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
        self.location = location
        self._path = jvm.org.apache.hadoop.fs.Path
        self._root = self._path(location)
        self._filesystem = self._root.getFileSystem(hadoop_conf)

    def _log_path(self, log: str, batch_id: int | None = None) -> Any:
        directory = self._path(self._root, log)
        return directory if batch_id is None else self._path(directory, str(batch_id))

    def last_committed_batch(self) -> int:
        """The highest batch id with a ``commits/N`` file; NO_BATCH (-1) when there is none."""
        directory = self._log_path(COMMITS)
        if not self._filesystem.exists(directory):
            return NO_BATCH
        names = (status.getPath().getName() for status in self._filesystem.listStatus(directory))
        return max((int(name) for name in names if name.isdigit()), default=NO_BATCH)

    def is_committed(self, batch_id: int) -> bool:
        """Whether ``commits/N`` exists for batch N (one call: listing the log costs calls per file it holds)."""
        return bool(self._filesystem.exists(self._log_path(COMMITS, batch_id)))

    def source_end_offsets(self, batch_id: int) -> list[str]:
        """The end offsets of every source for batch N, as Spark serialised them (JSON, or "-" for none).

        The offset log file is a version line, a metadata line, then one line per
        source; empty if the file is missing (it is written before the batch runs).
        """
        path = self._log_path(OFFSETS, batch_id)
        if not self._filesystem.exists(path):
            return []
        stream = self._filesystem.open(path)
        try:
            content: bytes = stream.readAllBytes()
        finally:
            stream.close()
        return content.decode("utf-8").splitlines()[2:]
