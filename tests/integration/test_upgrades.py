"""Upgrades and rollbacks at the process level (issue 27.1): replicas replaced under a writer's calls."""

from __future__ import annotations

import threading
from collections.abc import Callable

from coordinator_service.contract.client import CoordinatorClient
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess

# Writer calls at once while a replica stops (each in a thread of its own, on one client as a Spark driver's).
CONCURRENT_CALLS = 16


def test_a_replica_stopped_under_a_writers_calls_fails_none_of_them(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    """A rolling update's SIGTERM reaches a replica while a writer's calls arrive: gRPC answers a call that had not
    reached a handler when the server began to stop CANCELLED (grpc/grpc#41785; about one call per stop here), which
    the client did not retry, so the writer's call failed. The client repeats it, and the other replica answers."""
    first, second = coordinator_factory(), coordinator_factory()
    with first.client() as registering:
        registering.register_writer("orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
    answered: list[int] = []
    failures: list[BaseException] = []
    changed = threading.Condition()
    stop = threading.Event()
    # Either replica: the channel connects to the first and, once it is gone, to the second.
    with CoordinatorClient(f"ipv4:127.0.0.1:{first.grpc_port},127.0.0.1:{second.grpc_port}") as client:

        def call_again_and_again() -> None:
            while not stop.is_set():
                try:
                    client.sink_state("orders")
                except BaseException as error:
                    failures.append(error)
                    raise
                with changed:
                    answered.append(1)
                    changed.notify_all()

        def answered_more(count: int) -> None:
            with changed:
                target = len(answered) + count
                assert changed.wait_for(lambda: len(answered) >= target or bool(failures), 60), failures

        callers = [threading.Thread(target=call_again_and_again) for _ in range(CONCURRENT_CALLS)]
        for caller in callers:
            caller.start()
        try:
            answered_more(200)
            first.stop()
            answered_more(200)
        finally:
            stop.set()
            for caller in callers:
                caller.join(timeout=60)
    assert first.process is not None and first.process.returncode == 0
    assert failures == []
