"""Where the writer's files live: pyarrow file systems from pyiceberg's FileIO property names.

The coordinator reads, checks and deletes the same files through pyiceberg's
FileIO, configured by its catalog properties; the writer takes the same keys
(``s3.endpoint``, ``s3.region``, ``s3.access-key-id``, ``s3.secret-access-key``,
``s3.session-token``, ``s3.force-virtual-addressing``, ...), so one block of
settings serves both sides, and builds the same ``pyarrow.fs.S3FileSystem``
from them that pyiceberg's ``PyArrowFileIO`` builds. Keys left out fall back to
the AWS SDK's own chain on each machine (``AWS_ACCESS_KEY_ID``,
``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_WEB_IDENTITY_TOKEN_FILE`` with
``AWS_ROLE_ARN``, the instance's role, ``AWS_REGION``): the way to keep
secrets off command lines. Other schemes (``file://``, ``gs://``, ``hdfs://``,
``abfs://``) go to ``pyarrow.fs.FileSystem.from_uri`` with credentials from the
environment. A Storage is pickled to the executors with the task; its repr
never shows a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final
from urllib.parse import urlsplit

import pyarrow.fs as pafs

S3_SCHEMES: Final = frozenset({"s3", "s3a", "s3n"})  # as pyiceberg: Hadoop's spellings are the same store
# Stores of objects under keys, without directories: nothing to make before writing, a listing per key prefix.
OBJECT_STORE_SCHEMES: Final = S3_SCHEMES | {"gs", "gcs"}
SECRET_KEYS: Final = frozenset({"s3.secret-access-key", "s3.session-token"})
_TEXT: Final = {
    "s3.endpoint": "endpoint_override",
    "s3.region": "region",
    "s3.access-key-id": "access_key",
    "s3.secret-access-key": "secret_key",
    "s3.session-token": "session_token",
    "s3.proxy-uri": "proxy_options",
    "s3.role-arn": "role_arn",
    "s3.role-session-name": "session_name",
}
_SECONDS: Final = {"s3.connect-timeout": "connect_timeout", "s3.request-timeout": "request_timeout"}
_FLAGS: Final = {"s3.force-virtual-addressing": "force_virtual_addressing", "s3.anonymous": "anonymous"}
KEYS: Final = frozenset({*_TEXT, *_SECONDS, *_FLAGS})
_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off"})


@dataclass(frozen=True)
class Storage:
    """FileIO properties for the table's files; empty: every scheme with its environment's defaults."""

    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.properties) - KEYS)
        if unknown:
            raise ValueError(f"unknown storage properties {unknown}; the writer takes {sorted(KEYS)}")
        object.__setattr__(self, "properties", dict(self.properties))
        self._s3_options()  # every value checked now, not on an executor

    def __repr__(self) -> str:
        shown = {key: "***" if key in SECRET_KEYS else value for key, value in self.properties.items()}
        return f"Storage({shown})"

    @staticmethod
    def is_object_store(uri: str) -> bool:
        return urlsplit(uri).scheme in OBJECT_STORE_SCHEMES

    def filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """The file system holding `uri` and the path of `uri` inside it."""
        parts = urlsplit(uri)
        if parts.scheme in S3_SCHEMES:
            return self._s3, f"{parts.netloc}{parts.path}"
        filesystem, path = pafs.FileSystem.from_uri(uri)
        return filesystem, str(path)

    @cached_property
    def _s3(self) -> pafs.S3FileSystem:
        """One S3 client (and connection pool) for every file of this storage, built where it is first used."""
        return pafs.S3FileSystem(**self._s3_options())

    def _s3_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        for key, value in self.properties.items():
            if key in _TEXT:
                options[_TEXT[key]] = value
            elif key in _SECONDS:
                try:
                    options[_SECONDS[key]] = float(value)
                except ValueError:
                    raise ValueError(f"storage property {key} must be a number of seconds, got {value!r}") from None
            elif value.lower() in _TRUE | _FALSE:
                options[_FLAGS[key]] = value.lower() in _TRUE
            else:
                raise ValueError(f"storage property {key} must be true or false, got {value!r}")
        return options
