"""The data files of a pre-commit on storage: their Parquet footers, sent by the writer or read, and their checks.

A writer that wrote a file holds its footer: it may send it with the path (PreCommit's DataFile.parquet_footer,
with file_size_in_bytes). The coordinator then checks the file's metadata (it exists, its size is the one sent,
it is not older than ORPHAN_GRACE_SECONDS) instead of reading the footer, which on an object store costs one or
two more requests of tens of milliseconds each: by one listing of the pre-commit's `files_directory` when the
writer names one (one request per 1,000 files, however many files), else by one metadata request per file. It
reads the footer itself when none was sent, and checks on its own a file the listing does not show. Requests
of one pre-commit run concurrently, on a pool shared by all pre-commits (pyarrow releases the GIL while it
waits on storage or parses a footer).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO, InputFile
from pyiceberg.io.pyarrow import PyArrowFile

from coordinator_service import metrics
from coordinator_service.contract.errors import InvalidArgument, cause, quote
from coordinator_service.tables.file_listing import ListedFile, listed_files, written_by
from coordinator_service.tables.pyiceberg_internals import file_info

# Storage requests of pre-commits in flight at once, over all sinks.
MAX_CONCURRENT_FILE_CHECKS = 16


@dataclass(frozen=True)
class FileFacts:
    """What a writer sent about a data file besides its path; b"" and 0 when it did not send them."""

    parquet_footer: bytes = b""
    file_size_in_bytes: int = 0


@dataclass(frozen=True)
class CheckedFile:
    """A data file that exists, with its footer, its size on storage and when it was last written (None where the
    store does not tell)."""

    path: str
    footer: pq.FileMetaData
    size: int
    mtime_ns: int | None

    def written_at(self, otherwise: float) -> float:
        """When it was written, in Unix seconds; `otherwise` where the store does not tell."""
        return otherwise if self.mtime_ns is None else self.mtime_ns / 1e9


def check_facts(path: str, facts: FileFacts) -> None:
    """Refuse facts that cannot be checked, before any storage request."""
    if facts.file_size_in_bytes < 0:
        raise InvalidArgument(f"data file {quote(path)}: file_size_in_bytes {facts.file_size_in_bytes} is negative")
    if facts.parquet_footer and not facts.file_size_in_bytes:
        raise InvalidArgument(
            f"data file {quote(path)}: a parquet_footer was sent without file_size_in_bytes; send the file's size "
            "with its footer (the coordinator checks it against storage), or neither"
        )


class FileChecks:
    """Checks the data files of pre-commits against storage, a bounded number at a time."""

    def __init__(self, orphan_grace_seconds: float = math.inf) -> None:
        # A pre-commit refuses a file older than this: the orphan sweep may delete such a file under it.
        self.orphan_grace_seconds = orphan_grace_seconds
        self._pool = ThreadPoolExecutor(MAX_CONCURRENT_FILE_CHECKS, thread_name_prefix="precommit-files")

    def check(
        self,
        io: FileIO,
        paths: Sequence[str],
        facts: Mapping[str, FileFacts],
        directory: str = "",
        subject: str = "data file",
    ) -> list[CheckedFile]:
        """Every file checked, in the order of `paths`; InvalidArgument naming the first bad one (a `subject`: a data
        file, a key file).

        `directory` (a canonical URI holding every path, or ""): the sent footers' files are looked up in one
        listing of it when there are several."""
        listed: Mapping[str, ListedFile] = {}
        if directory and sum(1 for path in paths if facts.get(path, FileFacts()).parquet_footer) > 1:
            listed = listed_files(io, directory) or {}  # an IO that cannot list: the files one by one
        if len(paths) <= 1:
            return [self._check(io, path, facts.get(path, FileFacts()), listed.get(path), subject) for path in paths]
        futures = [
            self._pool.submit(self._check, io, path, facts.get(path, FileFacts()), listed.get(path), subject)
            for path in paths
        ]
        try:
            return [future.result() for future in futures]
        finally:
            _cancel(futures)

    def _check(self, io: FileIO, path: str, facts: FileFacts, listed: ListedFile | None, subject: str) -> CheckedFile:
        if facts.parquet_footer:
            footer = _decode_footer(path, facts.parquet_footer, subject)
            size, mtime_ns = (listed.size, listed.mtime_ns) if listed else _stat(path, io.new_input(path), subject)
            metrics.PRECOMMIT_FOOTERS.labels("sent").inc()
        else:
            footer, size, mtime_ns = _read_footer(path, io.new_input(path), subject)
            metrics.PRECOMMIT_FOOTERS.labels("read").inc()
        if facts.file_size_in_bytes and size != facts.file_size_in_bytes:
            # The size on storage is not echoed: a writer learns nothing about a file it did not write.
            raise InvalidArgument(
                f"{subject} {quote(path)} on storage is not {facts.file_size_in_bytes} bytes, the size the writer "
                "sent: it is not the file the writer wrote (changed or replaced since). Write the batch again"
            )
        if mtime_ns is not None:
            age = time.time() - mtime_ns / 1e9
            if age > self.orphan_grace_seconds:
                raise InvalidArgument(
                    f"{subject} {quote(path)} was written {age:.0f} s ago, longer than ORPHAN_GRACE_SECONDS "
                    f"({self.orphan_grace_seconds:g} s): the orphan sweep may be deleting it. Write the batch again"
                )
        return CheckedFile(path, footer, size, mtime_ns)


def _cancel(futures: Sequence[Future[CheckedFile]]) -> None:
    """Checks not started yet are dropped (after a failure, the answer is known)."""
    for future in futures:
        future.cancel()


def _decode_footer(path: str, serialized: bytes, subject: str) -> pq.FileMetaData:
    try:
        return pq.read_metadata(pa.BufferReader(serialized))
    except (pa.ArrowInvalid, OSError) as error:
        raise InvalidArgument(
            f"{subject} {quote(path)}: its parquet_footer is not a serialized Parquet footer ({cause(error)}); "
            "send the bytes pyarrow's FileMetaData.write_metadata_file writes, or no footer"
        ) from error


def _stat(path: str, input_file: InputFile, subject: str) -> tuple[int, int | None]:
    """Size and modification time (None where the file IO does not tell) in one metadata request.

    A file that does not exist is refused; any other storage error propagates (an outage, not the request's
    fault)."""
    try:
        if isinstance(input_file, PyArrowFile):
            info = file_info(input_file)
            return info.size, written_by(info.mtime_ns)
        return len(input_file), None
    except FileNotFoundError:
        raise InvalidArgument(f"{subject} {quote(path)} does not exist: write it before the pre-commit") from None


def _read_footer(path: str, input_file: InputFile, subject: str) -> tuple[pq.FileMetaData, int, int | None]:
    """The footer read from storage, the size and the modification time (None where the file IO does not tell)."""
    try:
        with input_file.open() as stream:
            footer = pq.read_metadata(stream)
        size, mtime_ns = _stat(path, input_file, subject)
    except FileNotFoundError:
        raise InvalidArgument(f"{subject} {quote(path)} does not exist: write it before the pre-commit") from None
    except (pa.ArrowInvalid, OSError) as error:
        raise InvalidArgument(f"{subject} {quote(path)} is not a readable Parquet file: {cause(error)}") from error
    return footer, size, mtime_ns
