"""The process Spark plans the Kafka stream in ends without a traceback when Spark closes it.

The JVM's side is played here with pyspark's own serializers: pyspark's real
``python_streaming_source_runner`` connects, is sent the Kafka data source, creates
its stream reader, and is then closed on as a stopping query closes it.
"""

from __future__ import annotations

import itertools
import os
import pickle
import secrets
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.serializers import UTF8Deserializer, read_int, write_int, write_with_length

from spark_writer.kafka.planner_end import PLANNER_MODULE, only_the_connections_end
from spark_writer.kafka.source import KafkaDataSource

ROOT = Path(__file__).resolve().parents[2]
ANSWER_SECONDS = 60


def write_text(text: str, connection: socket.SocketIO) -> None:
    write_with_length(text.encode("utf-8"), connection)


def planner_closed_by_spark(tmp_path: Path, reset: bool) -> subprocess.CompletedProcess[str]:
    """Start pyspark's stream planner, let it create the Kafka source's reader, then close on it (a reset, or an
    orderly close) as a stopping query does; the finished process."""
    secret = secrets.token_hex(16)
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(ANSWER_SECONDS)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PYTHON_WORKER_FACTORY_PORT": str(server.getsockname()[1]),
            "PYTHON_WORKER_FACTORY_SECRET": secret,
            "SINK_WRITER_LOG_LEVEL": "INFO",
        }
        planner = subprocess.Popen(
            [sys.executable, "-m", PLANNER_MODULE],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        connection, _ = server.accept()
        with connection:
            connection.settimeout(ANSWER_SECONDS)
            stream = connection.makefile("rwb")
            assert UTF8Deserializer().loads(stream) == secret
            write_text("ok", stream)
            stream.flush()
            read_int(stream)  # the planner's pid
            write_text("{}.{}".format(*sys.version_info[:2]), stream)
            write_text(str(tmp_path), stream)  # Spark's files directory
            write_int(0, stream)  # no Python includes
            source = KafkaDataSource({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "orders"})
            write_with_length(pickle.dumps(source), stream)
            write_text(source.schema().json(), stream)
            write_int(10_000, stream)  # the largest Arrow batch
            stream.flush()
            assert read_int(stream) == 0  # the reader is made: the planner waits for the JVM's calls
            if reset:
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stream.close()
        stdout, stderr = planner.communicate(timeout=ANSWER_SECONDS)
    return subprocess.CompletedProcess(planner.args, planner.returncode, stdout, stderr)


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
def test_a_planner_that_spark_closes_ends_without_a_traceback(tmp_path: Path, reset: bool) -> None:
    """On the old code the reset case printed three chained tracebacks (the reset, then two broken pipes) on the
    job's stderr; the orderly close printed them only when the planner lost the race (under load)."""
    finished = planner_closed_by_spark(tmp_path, reset)
    assert "Traceback" not in finished.stderr, finished.stderr
    assert finished.returncode != 0  # pyspark's own verdict: the planner did not end on the JVM's word


def test_an_error_of_its_own_is_not_the_connections_end() -> None:
    def chained(*errors: BaseException) -> BaseException:
        for earlier, later in itertools.pairwise(errors):
            later.__context__ = earlier
        return errors[-1]

    assert only_the_connections_end(chained(EOFError(), BrokenPipeError(32, "Broken pipe")))
    assert only_the_connections_end(chained(ConnectionResetError(), BrokenPipeError(), BrokenPipeError()))
    assert not only_the_connections_end(chained(ValueError("a reader's own"), BrokenPipeError()))
    assert not only_the_connections_end(chained(EOFError(), KeyError("later")))
    assert not only_the_connections_end(RuntimeError("alone"))
