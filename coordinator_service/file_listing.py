"""Files under a directory of a table's storage, listed in one request per page (1,000 keys on S3)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO


@dataclass(frozen=True)
class ListedFile:
    size: int
    mtime_ns: int | None  # None where the store does not tell


def listed_files(io: FileIO, directory: str) -> dict[str, ListedFile] | None:
    """Every file under `directory` (a URI, recursively) by URI ({} when it does not exist); None when the file IO
    cannot list (only pyiceberg's PyArrowFileIO can)."""
    if not isinstance(io, PyArrowFileIO):
        return None
    scheme, netloc, path = io.parse_location(directory)
    try:
        infos = io.fs_by_scheme(scheme, netloc).get_file_info(
            pafs.FileSelector(path, recursive=True, allow_not_found=True)
        )
    except FileNotFoundError:
        return {}
    return {
        f"{scheme}://{info.path}": ListedFile(info.size, info.mtime_ns)
        for info in infos
        if info.type == pafs.FileType.File
    }
