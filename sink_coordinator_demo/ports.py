"""Local TCP ports for the services the demo, the tests and the benchmarks start."""

from __future__ import annotations

import socket


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(preferred: int | None = None, host: str = "127.0.0.1") -> int:
    """`preferred` when nothing listens on it, else (or without one) a port the system picks."""
    if preferred is not None and port_is_free(preferred, host):
        return preferred
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
