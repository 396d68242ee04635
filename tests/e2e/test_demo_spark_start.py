"""The demo's Spark, started in the background with its Python workers warm (sink_coordinator_demo.spark_start): the
first job's two Python steps of each task find the writer's modules imported, where a session started without the
warm-up does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Each of a job's two Python steps says, per task, which worker ran it and whether the writer's modules were
# imported in that worker before it ran; in a process of its own (a session of this process may have warm workers).
FIRST_JOB = """
import json, os, sys
from pathlib import Path

import pyarrow as pa

from sink_coordinator_demo.spark_start import TASK_MODULES, SparkStart
from spark_writer.driver_jvm import SparkLog
from spark_writer.session import local_spark_session


def first(batches):
    warm = all(name in sys.modules for name in TASK_MODULES)
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"pid1": [os.getpid()] * batch.num_rows, "warm1": [warm] * batch.num_rows})


def second(batches):
    warm = all(name in sys.modules for name in TASK_MODULES)
    for batch in batches:
        yield pa.RecordBatch.from_pydict(
            {**batch.to_pydict(), "pid2": [os.getpid()] * batch.num_rows, "warm2": [warm] * batch.num_rows}
        )


log = SparkLog(Path(sys.argv[1]))
if sys.argv[2] == "warm":
    start = SparkStart("local[2]", None, log, records_in_jvm=False).begin()
    spark = start.wait()
else:
    spark = local_spark_session("cold", "local[2]", log, records_in_jvm=False)
numbers = spark.range(2, numPartitions=2)
rows = numbers.mapInArrow(first, "pid1 long, warm1 boolean").mapInArrow(
    second, "pid1 long, warm1 boolean, pid2 long, warm2 boolean"
)
print(json.dumps([row.asDict() for row in rows.collect()]))
spark.stop()
"""


def first_job(tmp_path: Path, how: str) -> list[dict[str, object]]:
    result = subprocess.run(
        [sys.executable, "-c", FIRST_JOB, str(tmp_path / f"spark-{how}.log"), how],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows: list[dict[str, object]] = json.loads(result.stdout.strip().splitlines()[-1])
    return rows


@pytest.mark.spark
def test_the_first_job_after_the_warm_up_finds_its_workers_started(tmp_path: Path) -> None:
    cold = first_job(tmp_path, "cold")
    assert len(cold) == 2 and not any(row["warm1"] or row["warm2"] for row in cold), cold
    warm = first_job(tmp_path, "warm")
    assert len(warm) == 2 and all(row["warm1"] and row["warm2"] for row in warm), warm
    # Two steps of a task are two workers: the warm-up started both.
    assert all(row["pid1"] != row["pid2"] for row in warm), warm
