"""The demo's background start of Spark (sink_coordinator_demo.spark_start): a start that fails says why when the
demo waits for it, and stopping it then stops nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sink_coordinator_demo import spark_start
from sink_coordinator_demo.spark_start import SparkStart
from spark_writer.driver_jvm import SparkLog


def test_a_start_that_fails_says_why_when_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_java(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no Java 17+ found")

    monkeypatch.setattr(spark_start, "local_spark_session", no_java)
    start = SparkStart("local[2]", None, SparkLog(tmp_path / "spark.log"), records_in_jvm=False).begin()
    with pytest.raises(RuntimeError, match="no Java 17"):
        start.wait()
    start.stop()  # nothing started: nothing to stop, and no wait
    assert start.spark is None and start.cluster is None
