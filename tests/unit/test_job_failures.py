"""What ended a `sink-writer` run, as one line and an exit code (spark_writer.job_failures): the same whether the
exception was raised in the driver or reached it as the text of Spark's report of a task or a foreachBatch call."""

from __future__ import annotations

import traceback

import grpc
import pytest
from pyspark.errors import PySparkException

from coordinator_service.contract.client import CoordinatorRpcError
from spark_writer.formats.record_decoding import ON_BAD_RECORD_HINT, BadRecordError
from spark_writer.formats.registry_subjects import SchemaChangeError
from spark_writer.formats.schema_registry import RegistryUnavailableError
from spark_writer.job_failures import EXIT_CODES, MAX_CAUSE_CHARS, ExitCode, JobFailure, failure_of, one_line
from spark_writer.kafka.data_loss import DataLossError
from spark_writer.routing.routes import UnroutedRecordsError

BAD_RECORD = (
    f"a Kafka record does not fit the JSON schema: topic tiny partition 0 offset 0: id (bigint). {ON_BAD_RECORD_HINT}"
)
MISMATCH = """data file 'file:///w/shop/good/data/0.parquet' does not fit the schema of the table: Mismatch in fields:
┏━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃    ┃ Table field                ┃ Dataframe field            ┃
┡━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ ✅ │ 1: id: optional long       │ 1: id: optional long       │
│ ❌ │ 2: amount: optional double │ 2: amount: optional string │
└────┴────────────────────────────┴────────────────────────────┘
"""


class StreamingQueryFailed(PySparkException):
    """Stands for pyspark's StreamingQueryException (which needs a JVM): only its text carries what happened."""

    def __init__(self, message: str) -> None:
        super().__init__(message=message)


def traceback_of(error: BaseException) -> str:
    """The error as Python prints it, raised from a frame (as a worker or the py4j callback server sends it)."""
    try:
        raise error
    except BaseException as raised:
        return "".join(traceback.format_exception(raised))


def in_a_task(error: BaseException) -> StreamingQueryFailed:
    """Spark's report of a batch whose task raised `error` in a Python worker: the foreachBatch call's traceback
    (the driver's collect() failed), the worker's inside it, then Spark's SQL state and the query's description."""
    worker = "An exception was thrown from the Python worker:\n" + traceback_of(error)
    driver = traceback_of(RuntimeError("collect() failed")).replace(
        "RuntimeError: collect() failed", f"pyspark.errors.exceptions.captured.PythonException: {worker}"
    )
    return StreamingQueryFailed(
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch sink. "
        f"Reason: An exception was raised by the Python Proxy. Return Message: {driver}\n SQLSTATE: 39000 "
        "SQLSTATE: XXKST\n=== Streaming Query ===\nIdentifier: tiny [id = 823e24eb]\n"
        "\tat org.apache.spark.Foo(Foo.scala:1)"
    )


def in_the_batch_function(error: BaseException) -> StreamingQueryFailed:
    """Spark's report of a batch whose foreachBatch function raised `error` in the driver."""
    return StreamingQueryFailed(
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch sink. "
        f"Reason: An exception was raised by the Python Proxy. Return Message: {traceback_of(error)}\n"
        " SQLSTATE: 39000\n\tat org.apache.spark.sql.execution.streaming.sources.ForeachBatchSink.callBatchWriter"
    )


@pytest.mark.parametrize(
    "error",
    [
        BadRecordError(BAD_RECORD),
        DataLossError("partition orders-0 lost offsets 0 to 10. Set the option failOnDataLoss=false"),
        UnroutedRecordsError("batch 0: 20 record(s) whose route column 'country' has no route"),
        SchemaChangeError("version 3 of subject orders-value (schema id 7) cannot be read into the table"),
        RegistryUnavailableError("the schema registry at http://registry:8081 could not be reached"),
        CoordinatorRpcError(grpc.StatusCode.INVALID_ARGUMENT, MISMATCH),
        CoordinatorRpcError(grpc.StatusCode.FAILED_PRECONDITION, "writer term 3 is fenced by term 4"),
        CoordinatorRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"),
        CoordinatorRpcError(grpc.StatusCode.INTERNAL, "unexpected"),
        ZeroDivisionError("division by zero"),
    ],
    ids=lambda error: f"{type(error).__name__}",
)
def test_raised_here_in_a_task_or_in_the_batch_function_the_failure_is_the_same(error: BaseException) -> None:
    here = failure_of(error)
    assert failure_of(in_a_task(error)).__dict__ == here.__dict__
    assert failure_of(in_the_batch_function(error)).__dict__ == here.__dict__
    assert "\n" not in here.cause
    assert str(error).splitlines()[0].strip() in here.cause


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [
        (BadRecordError(BAD_RECORD), ExitCode.BAD_DATA),
        (DataLossError("lost"), ExitCode.BAD_DATA),
        (UnroutedRecordsError("unrouted"), ExitCode.BAD_DATA),
        (SchemaChangeError("changed"), ExitCode.BAD_DATA),
        (RegistryUnavailableError("down"), ExitCode.UNREACHABLE),
        (CoordinatorRpcError(grpc.StatusCode.UNAVAILABLE, "down"), ExitCode.UNREACHABLE),
        (CoordinatorRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "slow"), ExitCode.UNREACHABLE),
        (CoordinatorRpcError(grpc.StatusCode.UNAUTHENTICATED, "no token"), ExitCode.REFUSED),
        (CoordinatorRpcError(grpc.StatusCode.PERMISSION_DENIED, "not your sink"), ExitCode.REFUSED),
        (CoordinatorRpcError(grpc.StatusCode.FAILED_PRECONDITION, "fenced"), ExitCode.REFUSED),
        (CoordinatorRpcError(grpc.StatusCode.INTERNAL, "bug"), ExitCode.FAILED),
        (ZeroDivisionError("division by zero"), ExitCode.FAILED),
    ],
)
def test_the_exit_code_says_the_kind(error: BaseException, exit_code: ExitCode) -> None:
    assert failure_of(error).exit_code is exit_code


def test_every_kind_of_the_package_is_in_the_table() -> None:
    assert {code for code in EXIT_CODES.values()} == {ExitCode.BAD_DATA, ExitCode.UNREACHABLE, ExitCode.REFUSED}


def test_a_bad_record_is_its_own_message_and_the_fix_it_names() -> None:
    failure = failure_of(in_a_task(BadRecordError(BAD_RECORD)))
    assert failure.cause == BAD_RECORD
    assert "--on-bad-record null" in failure.cause


def test_a_coordinator_refusal_with_a_table_becomes_one_readable_line() -> None:
    cause = failure_of(in_the_batch_function(CoordinatorRpcError(grpc.StatusCode.INVALID_ARGUMENT, MISMATCH))).cause
    assert cause.startswith("the coordinator refused the writer: INVALID_ARGUMENT: data file ")
    assert (
        "✅ 1: id: optional long 1: id: optional long ❌ 2: amount: optional double 2: amount: optional string" in cause
    )
    assert not set(cause) & set("┏┳┓┃┡╇┩│└┴┘━─")


def test_a_task_error_of_another_kind_is_named_by_its_class() -> None:
    failure = failure_of(in_a_task(ZeroDivisionError("division by zero")))
    assert (failure.cause, failure.exit_code) == ("ZeroDivisionError: division by zero", ExitCode.FAILED)


def test_sparks_own_failure_is_its_first_line_without_class_and_state() -> None:
    report = StreamingQueryFailed(
        "[STREAM_FAILED] Query [id = 1] terminated with exception: No space left on device SQLSTATE: XXKST\n"
        "\tat org.apache.spark.sql.execution.streaming.StreamExecution.runStream(StreamExecution.scala:1)"
    )
    failure = failure_of(report)
    assert (failure.cause, failure.exit_code) == (
        "Query [id = 1] terminated with exception: No space left on device",
        ExitCode.FAILED,
    )


def test_a_job_failure_is_its_own_answer() -> None:
    failure = JobFailure("topic 'x' does not exist", ExitCode.USAGE)
    assert failure_of(failure) is failure


def test_one_line_is_bounded() -> None:
    line = one_line("word " * MAX_CAUSE_CHARS)
    assert len(line) == MAX_CAUSE_CHARS
    assert line.endswith("…")
    assert one_line("a\n\n  b\t┃ c ┃") == "a b c"
