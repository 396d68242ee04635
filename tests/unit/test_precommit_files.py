"""How a pre-commit's files are checked: concurrently, answered in request order, the first bad file named.

Storage here is an in-memory file IO whose reads wait for one another: checks made one after the other
would never get past the first file.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile

from coordinator_service.contract.client import MAX_FOOTER_BYTES_PER_PRECOMMIT, PreCommitFile, _sent_files
from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.tables.precommit_files import MAX_CONCURRENT_FILE_CHECKS, FileChecks, FileFacts, check_facts


def parquet_bytes(rows: int) -> bytes:
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": pa.array(range(rows), pa.int64())}), buffer)
    return bytes(buffer.getvalue().to_pybytes())


class MemoryFile(InputFile):
    def __init__(self, location: str, data: bytes | None, rendezvous: threading.Barrier, timeout: float) -> None:
        super().__init__(location)
        self._data = data
        self._rendezvous = rendezvous
        self._timeout = timeout

    def __len__(self) -> int:
        if self._data is None:
            raise FileNotFoundError(self.location)
        return len(self._data)

    def exists(self) -> bool:
        return self._data is not None

    def open(self, seekable: bool = True) -> InputStream:
        self._rendezvous.wait(self._timeout)  # every file of the request is being read at once
        if self._data is None:
            raise FileNotFoundError(self.location)
        return pa.BufferReader(self._data)


class RendezvousIO(FileIO):
    """Files by path; a read returns once `readers` reads are under way together."""

    def __init__(self, files: dict[str, bytes | None], readers: int, timeout: float = 10.0) -> None:
        super().__init__()
        self.files = files
        self.rendezvous = threading.Barrier(readers)
        self.timeout = timeout

    def new_input(self, location: str) -> InputFile:
        return MemoryFile(location, self.files[location], self.rendezvous, self.timeout)

    def new_output(self, location: str) -> OutputFile:
        raise NotImplementedError

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise NotImplementedError


def test_the_files_of_a_pre_commit_are_read_concurrently_and_answered_in_order() -> None:
    files: dict[str, bytes | None] = {f"mem://t/data/{i}.parquet": parquet_bytes(i + 1) for i in range(8)}
    checked = FileChecks().check(RendezvousIO(files, readers=8), list(files), {})
    assert [file.path for file in checked] == list(files)
    assert [file.footer.num_rows for file in checked] == list(range(1, 9))
    assert [file.size for file in checked] == [len(data or b"") for data in files.values()]


def test_the_first_bad_file_in_the_request_is_named() -> None:
    files: dict[str, bytes | None] = {
        "mem://t/data/good.parquet": parquet_bytes(3),
        "mem://t/data/first-missing.parquet": None,
        "mem://t/data/not-parquet.parquet": b"plain text",
        "mem://t/data/second-missing.parquet": None,
    }
    with pytest.raises(InvalidArgument, match=r"first-missing\.parquet' does not exist"):
        FileChecks().check(RendezvousIO(files, readers=4), list(files), {})


def test_checks_are_bounded() -> None:
    """More files than checks in flight: the rendezvous of more readers than the bound is never reached."""
    files: dict[str, bytes | None] = {
        f"mem://t/data/{i}.parquet": parquet_bytes(1) for i in range(MAX_CONCURRENT_FILE_CHECKS + 1)
    }
    io = RendezvousIO(files, readers=MAX_CONCURRENT_FILE_CHECKS + 1, timeout=2.0)
    with pytest.raises(threading.BrokenBarrierError):
        FileChecks().check(io, list(files), {})


def test_a_sent_footer_is_not_read_again() -> None:
    data = parquet_bytes(5)
    footer = pa.BufferOutputStream()
    pq.read_metadata(pa.BufferReader(data)).write_metadata_file(footer)
    io = RendezvousIO({"mem://t/data/a.parquet": data}, readers=2)  # a read would wait for a second one
    facts = {"mem://t/data/a.parquet": FileFacts(footer.getvalue().to_pybytes(), len(data))}
    (checked,) = FileChecks().check(io, ["mem://t/data/a.parquet"], facts)
    assert (checked.footer.num_rows, checked.size) == (5, len(data))


@pytest.mark.parametrize(
    ("facts", "message"),
    [(FileFacts(b"PAR1...", 0), "without file_size_in_bytes"), (FileFacts(b"", -1), "is negative")],
)
def test_facts_that_cannot_be_checked_are_refused(facts: FileFacts, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        check_facts("mem://t/data/a.parquet", facts)


def test_the_client_sends_footers_up_to_its_budget() -> None:
    footer = b"f" * (MAX_FOOTER_BYTES_PER_PRECOMMIT // 3)
    files = ["a.parquet", *(PreCommitFile(f"{i}.parquet", footer, 100 + i) for i in range(4))]
    [sent, keys] = _sent_files(files, [PreCommitFile("keys.parquet", footer, 7)])
    assert [data_file.path for data_file in sent] == ["a.parquet", "0.parquet", "1.parquet", "2.parquet", "3.parquet"]
    assert [len(data_file.parquet_footer) for data_file in sent] == [0, len(footer), len(footer), len(footer), 0]
    assert [data_file.file_size_in_bytes for data_file in sent] == [0, 100, 101, 102, 103]
    # Key files share the budget: the data files spent it.
    assert [(key_file.path, key_file.parquet_footer, key_file.file_size_in_bytes) for key_file in keys] == [
        ("keys.parquet", b"", 7)
    ]
