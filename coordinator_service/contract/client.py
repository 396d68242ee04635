"""The typed gRPC client that writers (the Spark driver) and the tests use.

Calls that are safe to repeat (all of them: the protocol is idempotent) are
retried on UNAVAILABLE, and on a CANCELLED the client did not cause, with
backoff until the call's deadline; every other status is raised at once as a
CoordinatorRpcError carrying the server's message.
Its answers are the protocol's own shapes (coordinator_service.contract.views), read off
the messages by coordinator_service.contract.wire. It imports only the base dependencies
(grpcio, protobuf, tenacity): the Spark writer uses it where the server's are not
installed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.contract.views import CheckpointResult, PreCommitResult, Registration, SinkState, TablesEnsured
from coordinator_service.contract.wire import from_message

Response = TypeVar("Response")

# Footers sent in one PreCommit at most: the coordinator reads those of the files beyond (gRPC refuses
# messages over 4 MiB by default; a footer is a few KiB per file, more with many columns or row groups).
MAX_FOOTER_BYTES_PER_PRECOMMIT = 2 * 1024 * 1024

# The longest the channel waits before it tries a coordinator it could not reach again. gRPC's default backoff grows
# 1.6 x per failed connection up to 120 s (attempts at about 0, 1, 2.6, 5, 9, 16, 26, 43, 70 s): a coordinator back
# after 44 s was found 26 s later, past a writer's 60 s of retries, and every wait for a coordinator just started
# lost 1-2 s. One attempt a second is nothing to a coordinator, and a writer finds it within about a second.
MAX_RECONNECT_SECONDS = 1.0
_RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(MAX_RECONNECT_SECONDS * 1000)),
)


class CoordinatorRpcError(Exception):
    """A call the coordinator refused or could not answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class PreCommitFile:
    """A data file to pre-commit. A writer that holds the file's Parquet footer sends it (pyarrow's FileMetaData
    written with write_metadata_file) with the file's size: the coordinator then checks the file with one metadata
    request instead of reading its footer from storage. `table` names the Iceberg table the file belongs to
    (fan-out: one that ensure_tables made one of the sink's tables); "" is the sink's own table."""

    path: str
    parquet_footer: bytes = b""
    file_size_in_bytes: int = 0
    table: str = ""


@dataclass(frozen=True)
class TableSpec:
    """A table a fan-out writer routes records to: created from `arrow_schema` (Arrow IPC bytes) and partitioned by
    `partition_by` when missing (keyed by `key_columns` when given), given the schema's new columns when present."""

    table: str
    arrow_schema: bytes = b""
    partition_by: tuple[str, ...] = ()
    # The sink's key (an upsert or change stream): the table is keyed by it; () for an append stream.
    key_columns: tuple[str, ...] = ()


def _sent_files(*groups: Sequence[str | PreCommitFile]) -> list[list[pb.DataFile]]:
    """Each group of files (a pre-commit's data files, then its key files) as PreCommit sends them, with their footers
    as long as MAX_FOOTER_BYTES_PER_PRECOMMIT allows over all groups (the coordinator reads the others' from
    storage)."""
    budget = MAX_FOOTER_BYTES_PER_PRECOMMIT
    sent: list[list[pb.DataFile]] = []
    for files in groups:
        messages = []
        for file in files:
            if isinstance(file, str):
                messages.append(pb.DataFile(path=file))
                continue
            footer = file.parquet_footer if len(file.parquet_footer) <= budget else b""
            budget -= len(footer)
            messages.append(
                pb.DataFile(
                    path=file.path, parquet_footer=footer, file_size_in_bytes=file.file_size_in_bytes, table=file.table
                )
            )
        sent.append(messages)
    return sent


class CoordinatorClient:
    """A blocking client of one coordinator; one channel, safe to share between threads."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        timeout_seconds: float = 30.0,
        retry_seconds: float = 60.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.target = target
        self.timeout_seconds = timeout_seconds
        self.retry_seconds = retry_seconds
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = (
            grpc.secure_channel(target, credentials, options=_RECONNECT_OPTIONS)
            if credentials is not None
            else grpc.insecure_channel(target, options=_RECONNECT_OPTIONS)
        )
        self._stub = pb_grpc.SinkCoordinatorStub(self._channel)
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._channel.close()

    def _worth_repeating(self, error: BaseException) -> bool:
        """UNAVAILABLE; and CANCELLED unless this client closed its channel: it never cancels a call otherwise (its
        deadline is DEADLINE_EXCEEDED), so the server did. A replica that stops cancels the calls that had not reached
        a handler yet (grpc/grpc#41785: about one a stop under a busy writer), which another replica answers."""
        if not isinstance(error, grpc.RpcError):
            return False
        return error.code() == grpc.StatusCode.UNAVAILABLE or (
            error.code() == grpc.StatusCode.CANCELLED and not self._closed
        )

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def wait_serving(self, timeout_seconds: float, check_alive: Callable[[], None] | None = None) -> None:
        """Block until the coordinator's gRPC health Check says SERVING (the one call open without a token).

        `check_alive` runs between short checks and may raise, so that a
        coordinator process that died is noticed at once rather than at the timeout.
        """
        health = health_pb2_grpc.HealthStub(self._channel)
        deadline = time.monotonic() + timeout_seconds
        while True:
            if check_alive is not None:
                check_alive()
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0, wait_for_ready=True)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                if time.monotonic() > deadline:  # up, and not serving (its metastore not reached yet)
                    raise CoordinatorRpcError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"the coordinator at {self.target} is not serving after {timeout_seconds} s",
                    )
                time.sleep(0.1)  # up, not serving yet: no stream to wait on without a token
            except grpc.RpcError as error:
                if time.monotonic() > deadline:
                    raise CoordinatorRpcError(
                        error.code(), f"the coordinator at {self.target} is not serving after {timeout_seconds} s"
                    ) from error

    def _call(self, method: Callable[..., Response], request: object, timeout: float | None = None) -> Response:
        deadline = timeout or self.timeout_seconds
        retrying = Retrying(
            retry=retry_if_exception(self._worth_repeating),
            wait=wait_exponential_jitter(multiplier=0.1, max=5.0),
            stop=stop_after_delay(self.retry_seconds),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return method(request, timeout=deadline, metadata=self._metadata)
        except grpc.RpcError as error:
            raise CoordinatorRpcError(error.code(), error.details() or "") from error
        raise AssertionError("unreachable")

    def register_writer(
        self,
        sink: str,
        table: str,
        checkpointed_epoch: int,
        *,
        writer_count: int = 1,
        arrow_schema: bytes = b"",
        partition_by: Sequence[str] = (),
        key_columns: Sequence[str] = (),
    ) -> Registration:
        """Register the writer of `sink` (a new term). `key_columns`: the sink's key, for an upsert or change stream
        (its table keyed by them); the answer's `key_columns` says whether the coordinator recorded it."""
        response = self._call(
            self._stub.RegisterWriter,
            pb.RegisterWriterRequest(
                sink=sink,
                table=table,
                checkpointed_epoch=checkpointed_epoch,
                writer_count=writer_count,
                arrow_schema=arrow_schema,
                partition_by=list(partition_by),
                key_columns=list(key_columns),
            ),
        )
        return from_message(response, Registration)

    def pre_commit(
        self,
        sink: str,
        epoch: int,
        writer_term: int,
        files: Sequence[str | PreCommitFile],
        *,
        writer_id: int = 0,
        properties: Mapping[str, str] | None = None,
        evolve_schema: bool = False,
        files_directory: str = "",
        key_files: Sequence[str | PreCommitFile] = (),
        timeout_seconds: float | None = None,
    ) -> PreCommitResult:
        """Pre-commit the epoch's `files` (data files) and, for a keyed sink, its `key_files`: the keys it touched."""
        data_files, sent_key_files = _sent_files(files, key_files)
        response = self._call(
            self._stub.PreCommit,
            pb.PreCommitRequest(
                sink=sink,
                epoch=epoch,
                writer_term=writer_term,
                writer_id=writer_id,
                data_files=data_files,
                properties=dict(properties or {}),
                evolve_schema=evolve_schema,
                files_directory=files_directory,
                key_files=sent_key_files,
            ),
            timeout_seconds,
        )
        return from_message(response, PreCommitResult)

    def commit_checkpoint(
        self,
        sink: str,
        epoch: int,
        writer_term: int,
        *,
        wait: bool = False,
        timeout_seconds: float | None = None,
    ) -> CheckpointResult:
        response = self._call(
            self._stub.CommitCheckpoint,
            pb.CommitCheckpointRequest(sink=sink, epoch=epoch, writer_term=writer_term, wait=wait),
            timeout_seconds,
        )
        return from_message(response, CheckpointResult)

    def ensure_tables(self, sink: str, writer_term: int, tables: Sequence[TableSpec]) -> TablesEnsured:
        """Make sure of the tables the writer routes records to before it writes files under their locations (the
        answer's): the coordinator creates or evolves them and makes them the sink's, so that pre-commits may name
        them. Idempotent; refused for a fenced term."""
        response = self._call(
            self._stub.EnsureTables,
            pb.EnsureTablesRequest(
                sink=sink,
                writer_term=writer_term,
                tables=[
                    pb.TableSpec(
                        table=spec.table,
                        arrow_schema=spec.arrow_schema,
                        partition_by=list(spec.partition_by),
                        key_columns=list(spec.key_columns),
                    )
                    for spec in tables
                ],
            ),
        )
        return from_message(response, TablesEnsured)

    def sink_state(self, sink: str) -> SinkState:
        return from_message(self._call(self._stub.GetSinkState, pb.GetSinkStateRequest(sink=sink)), SinkState)
