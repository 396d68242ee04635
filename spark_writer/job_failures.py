"""How a `sink-writer` run that fails ends: one line naming the cause (and how to go on), and an exit code that says
which kind of failure it was, so that a supervisor can tell a command to fix from a service to wait for.

Spark reports a failed batch as a StreamingQueryException whose text nests everything that happened on the way: the
``foreachBatch`` function's Python traceback, inside it a task's (a record that does not fit is raised in a Python
worker and crosses the JVM as text), the JVM's stack traces and the query's plan. The cause is the innermost Python
exception of that text, ``module.Class: message``; its class says the kind, as it does for an exception raised in
this process. An error of Spark's own is its message's first line, code 1.
"""

from __future__ import annotations

import re
from enum import IntEnum
from typing import Final

import grpc
from pyspark.errors import PySparkException

from coordinator_service.contract.client import CoordinatorRpcError
from spark_writer.formats.record_decoding import BadRecordError
from spark_writer.formats.registry_subjects import SchemaChangeError
from spark_writer.formats.schema_registry import RegistryUnavailableError
from spark_writer.kafka.data_loss import DataLossError
from spark_writer.routing.routes import UnroutedRecordsError
from spark_writer.sink.sink_query import SinkRefusedError
from spark_writer.spark_errors import spark_message


class ExitCode(IntEnum):
    """What `sink-writer`'s exit code says; a stop by SIGINT or SIGTERM exits with 128 + the signal (130, 143)."""

    DONE = 0  # the job ended by itself: --available-now drained the topics
    FAILED = 1  # anything else: the error says what, Spark's log the details
    USAGE = 2  # the command line: a flag, a value, a name, a schema, a topic that does not exist
    BAD_DATA = 3  # records the job does not write as they are; the message names the flag that would
    REFUSED = 4  # the coordinator refused the writer; its message says why
    UNREACHABLE = 5  # the coordinator, Kafka or the schema registry did not answer: worth a retry later


class JobFailure(Exception):
    """The end of a run: its cause, one line, and its exit code."""

    def __init__(self, cause: str, exit_code: ExitCode) -> None:
        super().__init__(cause)
        self.cause = cause
        self.exit_code = exit_code


MAX_CAUSE_CHARS: Final = 2000
# The exceptions of this package whose kind is not a plain failure, by qualified class name: a task's reaches the
# driver as text. Records that stop the batch until they are fixed or a policy flag changes are bad data.
EXIT_CODES: Final = {
    f"{kind.__module__}.{kind.__qualname__}": exit_code
    for kind, exit_code in (
        (BadRecordError, ExitCode.BAD_DATA),
        (DataLossError, ExitCode.BAD_DATA),
        (UnroutedRecordsError, ExitCode.BAD_DATA),
        (SchemaChangeError, ExitCode.BAD_DATA),
        (RegistryUnavailableError, ExitCode.UNREACHABLE),
        (SinkRefusedError, ExitCode.REFUSED),
    )
}
COORDINATOR_ERROR: Final = f"{CoordinatorRpcError.__module__}.{CoordinatorRpcError.__qualname__}"
UNREACHABLE_CODES: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# What the coordinator answers when it will not take the writer's call as it is (coordinator_service.contract.errors).
REFUSAL_CODES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
TRACEBACK_HEADER: Final = "Traceback (most recent call last):"
# Box drawing (pyiceberg's schema mismatch tables); runs of whitespace.
_DRAWING: Final = re.compile(r"[\u2500-\u257f]+")
_SPACES: Final = re.compile(r"\s+")
_EXCEPTION_LINE: Final = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?:: (?P<message>.*))?$")


def one_line(text: str) -> str:
    """`text` as one line: tables' box drawing dropped, runs of whitespace (line breaks too) made one space."""
    line = _SPACES.sub(" ", _DRAWING.sub(" ", text)).strip()
    return line if len(line) <= MAX_CAUSE_CHARS else line[: MAX_CAUSE_CHARS - 1] + "…"


def innermost_python_exception(text: str) -> tuple[str, str] | None:
    """(qualified class name, message) of the exception the last Python traceback in `text` ends with.

    Its message goes on over the lines that follow until a blank or indented one (a JVM stack frame, Spark's
    ` SQLSTATE` or the next part of the report).
    """
    start = text.rfind(TRACEBACK_HEADER)
    if start < 0:
        return None
    lines = text[start + len(TRACEBACK_HEADER) :].splitlines()
    for index, line in enumerate(lines):
        if not line.strip() or line[0].isspace():
            continue  # the frames
        match = _EXCEPTION_LINE.match(line)
        if match is None:
            return None
        message = [match.group("message") or ""]
        for more in lines[index + 1 :]:
            if not more.strip() or more[0].isspace() or more.startswith("=== "):
                break
            message.append(more)
        return match.group("name"), "\n".join(message)
    return None


def coordinator_failure(code: grpc.StatusCode, message: str) -> JobFailure:
    if code in UNREACHABLE_CODES:
        return JobFailure(
            one_line(
                f"the coordinator did not answer ({code.name}: {message}): check that it runs and that "
                "--coordinator names it; --coordinator-retry-seconds says how long a call waits for it"
            ),
            ExitCode.UNREACHABLE,
        )
    if code in REFUSAL_CODES:
        return JobFailure(one_line(f"the coordinator refused the writer: {code.name}: {message}"), ExitCode.REFUSED)
    return JobFailure(one_line(f"a call to the coordinator failed: {code.name}: {message}"), ExitCode.FAILED)


def raised_failure(name: str, message: str) -> JobFailure:
    """The failure for an exception known by its class's qualified name and its message."""
    if name == COORDINATOR_ERROR:
        code_name, _, detail = message.partition(": ")
        code = grpc.StatusCode.__members__.get(code_name)
        if code is not None:
            return coordinator_failure(code, detail)
    if name in EXIT_CODES:
        return JobFailure(one_line(message), EXIT_CODES[name])
    return JobFailure(one_line(f"{name.rpartition('.')[2]}: {message}"), ExitCode.FAILED)


def failure_of(error: BaseException) -> JobFailure:
    """What ended the run, as one line and an exit code."""
    if isinstance(error, JobFailure):
        return error
    if isinstance(error, CoordinatorRpcError):
        return coordinator_failure(error.code, error.message)
    name = f"{type(error).__module__}.{type(error).__qualname__}"
    if name in EXIT_CODES:
        return raised_failure(name, str(error))
    raised = innermost_python_exception(str(error))
    if raised is not None:
        return raised_failure(*raised)
    if isinstance(error, PySparkException):
        return JobFailure(one_line(spark_message(error)), ExitCode.FAILED)
    return raised_failure(name, str(error))
