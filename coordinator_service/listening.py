"""The coordinator's two ports, taken exclusively, and checked before anything starts.

grpcio sets SO_REUSEPORT on its listening sockets unless told not to: a second coordinator started on the same
port (with its own metastore, say) would listen beside the first, and the kernel would hand it some of the
writers' connections, which would then register sinks and tables there. So gRPC binds with
`grpc.so_reuseport` off (GRPC_EXCLUSIVE_PORT), which also keeps out a later coordinator of the same
deployment: one process per port. Both ports are tried here first, so that a port in use is one line naming
it, before the metastore or the catalog is opened; the HTTP socket tried is the one uvicorn then serves on.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Final

from coordinator_service.contract.errors import CannotServe
from coordinator_service.settings.bounds import ENV_PREFIX

# The gRPC server's option that binds its port exclusively (grpcio's default shares it).
GRPC_EXCLUSIVE_PORT: Final = ("grpc.so_reuseport", 0)


def bind(host: str, port: int, api: str) -> socket.socket:
    """A listening TCP socket on host:port, alone there (SO_REUSEADDR only: a port left in TIME_WAIT by a
    coordinator that just stopped is free, a port someone listens on is not); CannotServe naming the port
    and its setting otherwise. `api` is "gRPC" or "HTTP"."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as error:
        setting = f"{api.lower()}_port"
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        if error.errno == errno.EADDRINUSE:
            problem = "is in use (another coordinator?): stop what listens there, or choose another port"
        else:
            problem = f"cannot be listened on ({os.strerror(error.errno or 0)}): choose another address or port"
        raise CannotServe(
            f"the {api} port {where} {problem} with --{setting.replace('_', '-')} or {ENV_PREFIX}{setting.upper()}"
        ) from None


def check_free(host: str, port: int, api: str) -> None:
    """Refuse (CannotServe) a port that something listens on; port 0 (any free port) is never refused."""
    if port != 0:
        bind(host, port, api).close()
