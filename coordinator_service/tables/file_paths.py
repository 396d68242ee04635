"""Where a data file may lie: the one spelling of a path the log keeps (a URI), and the checks that it lies inside the
table's data location (no '..', no link out of it)."""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Sequence
from urllib.parse import urlparse

from coordinator_service.contract.errors import InvalidArgument, quote


def canonical_uri(path: str) -> str:
    """The one spelling of a data file path the log keeps: a URI, file:// for local paths, normalized."""
    if not path:
        raise InvalidArgument("a data file path is empty")
    if "\x00" in path:
        raise InvalidArgument(f"data file path {quote(path)} contains a NUL character")
    parsed = urlparse(path)
    if ".." in parsed.path.split("/"):
        raise InvalidArgument(f"data file path {quote(path)} contains '..': send the normalized path")
    if not posixpath.isabs(parsed.path):
        raise InvalidArgument(f"data file path {quote(path)} is relative: send an absolute path or URI")
    scheme = parsed.scheme or "file"
    return f"{scheme}://{parsed.netloc}{posixpath.normpath(parsed.path)}"


def misplaced(uri: str, directories: Sequence[str]) -> str | None:
    """Why the canonical `uri` is not a file under one of `directories` (URIs), or None when it is one: on the same
    storage, below the directory, and on a local file system reached through no symbolic link below the directory
    (none of its components there is a link, itself included). What pre-commits accept and what deletions require
    (coordinator_service.engine.file_deletion)."""
    parsed = urlparse(uri)
    for directory in directories:
        root = urlparse(canonical_uri(directory))
        if (parsed.scheme, parsed.netloc) != (root.scheme, root.netloc):
            continue
        if not parsed.path.startswith(root.path.rstrip("/") + "/"):
            continue
        if parsed.scheme == "file" and _linked(parsed.path, root.path):
            return f"is reached through a symbolic link (its real path is {os.path.realpath(parsed.path)}) under"
        return None
    return "lies outside"


def _linked(path: str, root: str) -> bool:
    """A local path below `root` that is a symbolic link, or reached through one below `root`: each of its components
    after the root's own, looked at without following it (the root itself may be reached through links: where the
    table location lies is the operator's, what lies below it a writer's)."""
    current = root.rstrip("/")
    for name in path[len(current) + 1 :].split("/"):
        current = f"{current}/{name}"
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return True
        except OSError:  # missing, or a name no file can have: nothing below it exists, whether it does is checked
            return False  # on its own
    return False


def check_inside_location(
    uri: str, location: str, *, subject: str = "data file", within: str = "the table location"
) -> None:
    problem = misplaced(uri, [location])
    if problem is not None:
        raise InvalidArgument(f"{subject} {quote(uri)} {problem} {within} {location}")
