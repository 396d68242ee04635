"""The coordinator's two ports, taken exclusively, and checked before anything starts.

grpcio sets SO_REUSEPORT on its listening sockets unless told not to: a second coordinator started on the same
port (with its own metastore, say) would listen beside the first, and the kernel would hand it some of the
writers' connections, which would then register sinks and tables there. So one serving process binds its ports
exclusively (gRPC with `grpc.so_reuseport` off), which also keeps out a later coordinator of the same
deployment: one coordinator per port. Both ports are tried here first, so that a port in use is one line naming
it, before the metastore or the catalog is opened; the HTTP socket tried is the one uvicorn then serves on.

Several serving processes (PROCESSES > 1, coordinator_service.supervisor) share the ports through SO_REUSEPORT, and
the guarantee stays: the supervisor first takes each port exclusively (`reserve`), then lets SO_REUSEPORT in on the
socket it keeps (bound, never listening, so the kernel hands it no connection), and its processes listen beside it
(`bind(shared=True)`, `grpc_port_option(shared=True)`). Any later bind without SO_REUSEPORT, another coordinator of
one process or another supervisor's exclusive check, is refused while the supervisor runs, even while none of its
processes listens (a restart).
"""

from __future__ import annotations

import errno
import os
import socket

from coordinator_service.contract.errors import CannotServe
from coordinator_service.settings.bounds import ENV_PREFIX


def grpc_port_option(shared: bool) -> tuple[str, int]:
    """The gRPC server's option binding its port exclusively, or shared with the supervisor's other processes
    (grpcio's default shares it with anyone)."""
    return ("grpc.so_reuseport", int(shared))


def bind(host: str, port: int, api: str, *, shared: bool = False) -> socket.socket:
    """A listening TCP socket on host:port: alone there (SO_REUSEADDR only: a port left in TIME_WAIT by a
    coordinator that just stopped is free, a port someone listens on is not), or `shared` with the other serving
    processes of a supervisor that reserved the port; CannotServe naming the port and its setting otherwise. `api`
    is "gRPC" or "HTTP"."""
    try:
        return socket.create_server((host, port), family=_family(host), backlog=2048, reuse_port=shared)
    except OSError as error:
        raise _refusal(host, port, api, error) from None


def reserve(host: str, port: int, api: str) -> socket.socket:
    """Take host:port exclusively as `bind` does, without listening, then open it to SO_REUSEPORT sockets of this
    user (the serving processes) alone: keep the socket for as long as they serve. Port 0: a free port, the
    socket's."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # After the bind: the exclusive bind proved the port free, and SO_REUSEADDR cleared makes any later bind
        # without SO_REUSEPORT fail although nothing listens here.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    except OSError as error:
        sock.close()
        raise _refusal(host, port, api, error) from None
    return sock


def check_free(host: str, port: int, api: str) -> None:
    """Refuse (CannotServe) a port that something listens on; port 0 (any free port) is never refused."""
    if port != 0:
        bind(host, port, api).close()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _refusal(host: str, port: int, api: str, error: OSError) -> CannotServe:
    setting = f"{api.lower()}_port"
    where = f"[{host}]:{port}" if _family(host) == socket.AF_INET6 else f"{host}:{port}"
    if error.errno == errno.EADDRINUSE:
        problem = "is in use (another coordinator?): stop what listens there, or choose another port"
    else:
        problem = f"cannot be listened on ({os.strerror(error.errno or 0)}): choose another address or port"
    return CannotServe(
        f"the {api} port {where} {problem} with --{setting.replace('_', '-')} or {ENV_PREFIX}{setting.upper()}"
    )
