"""A writer's client finds its coordinator again soon after it returns, however long it was away.

gRPC's default reconnect backoff grows by 1.6 x per failed connection up to 120 s: after half a minute away, a
writer's client tried its coordinator again only every 17-27 s, so it found it that much after it served again, or
not within its retries (and a test, or the recovery bench, waited 1-2 s more for every coordinator it started). The
client's channel bounds the backoff.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from coordinator_service.contract.client import MAX_RECONNECT_SECONDS, CoordinatorClient, CoordinatorRpcError

# Connection attempts watched: with gRPC's defaults the gap before the fifth is 3.3-4.9 s.
ATTEMPTS = 7
# gRPC's jitter (±20 %) and this machine's scheduling on top of the bound.
GAP_ALLOWED = MAX_RECONNECT_SECONDS * 1.2 + 1.3


class RefusingServer:
    """A TCP port that accepts every connection and closes it at once (a coordinator not serving): each accept is
    one connection attempt of the client."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self.attempts: list[float] = []
        self._arrived = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            connection.close()
            with self._arrived:
                self.attempts.append(time.monotonic())
                self._arrived.notify_all()

    def wait_attempts(self, count: int, timeout: float) -> list[float]:
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.attempts) >= count, timeout):
                raise AssertionError(f"{len(self.attempts)} connection attempts in {timeout} s, {count} awaited")
            return self.attempts[:count]

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def refusing() -> Iterator[RefusingServer]:
    server = RefusingServer()
    yield server
    server.close()


def test_a_client_tries_its_absent_coordinator_again_at_least_every_bound(refusing: RefusingServer) -> None:
    with CoordinatorClient(f"127.0.0.1:{refusing.port}", retry_seconds=0) as client:
        with pytest.raises(CoordinatorRpcError):
            client.wait_serving(0.5)
        # gRPC's defaults take about 26 s to make 7 attempts: 40 s lets them show their gaps.
        attempts = refusing.wait_attempts(ATTEMPTS, timeout=40.0)
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    assert max(gaps) <= GAP_ALLOWED, f"gaps between connection attempts: {[round(gap, 2) for gap in gaps]}"
