"""Files under a directory of a table's storage, listed in one request per page (1,000 keys on S3).

A local file system is walked without following symbolic links, and only regular files are listed: a link under a
table's location (to another table's files, to a backup) is never taken for one of its files.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import pyarrow.fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO


@dataclass(frozen=True)
class ListedFile:
    size: int
    mtime_ns: int | None  # the latest moment it may have been written (written_by); None where the store does not tell


SECOND_NS = 1_000_000_000


def written_by(mtime_ns: int | None) -> int | None:
    """The latest moment a file with this modification time may have been written. A store that keeps whole
    seconds (S3's Last-Modified) truncates the moment: a whole second stands for any moment of it, and a file
    must never look older than it is (the orphan grace and a pre-commit's age check are ages)."""
    if mtime_ns is None or mtime_ns % SECOND_NS:
        return mtime_ns
    return mtime_ns + SECOND_NS - 1


def listed_files(io: FileIO, directory: str) -> dict[str, ListedFile] | None:
    """Every file under `directory` (a URI, recursively) by URI ({} when it does not exist); None when the file IO
    cannot list (only pyiceberg's PyArrowFileIO can)."""
    if not isinstance(io, PyArrowFileIO):
        return None
    scheme, netloc, path = io.parse_location(directory)
    filesystem = io.fs_by_scheme(scheme, netloc)
    if isinstance(filesystem, pafs.LocalFileSystem):
        return {f"{scheme}://{file}": listed for file, listed in _walk_local(path).items()}
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return {}
    return {
        f"{scheme}://{info.path}": ListedFile(info.size, written_by(info.mtime_ns))
        for info in infos
        if info.type == pafs.FileType.File
    }


def _walk_local(root: str) -> dict[str, ListedFile]:
    """Regular files under root, links neither followed nor listed (os.walk does not descend into linked
    directories; a linked file is not regular under lstat)."""
    files: dict[str, ListedFile] = {}
    for directory, _, names in os.walk(root, followlinks=False):
        for name in names:
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue  # deleted while listed
            if stat.S_ISREG(info.st_mode):
                files[path] = ListedFile(info.st_size, written_by(info.st_mtime_ns))
    return files
