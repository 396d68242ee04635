"""The worker daemon: a task's garbage collected, what outlives it frozen."""

from __future__ import annotations

import gc
import socket
import weakref

from spark_writer.worker_daemon import frozen_after_each_task


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_after_a_task_its_garbage_is_collected_and_what_lives_on_is_frozen() -> None:
    kept: list[_Cycle] = []
    garbage: list[weakref.ref[_Cycle]] = []

    def task(sock: socket.socket, authenticated: bool) -> int:
        kept.append(_Cycle())  # outlives the task, as a module's cache would
        garbage.append(weakref.ref(_Cycle()))  # a cycle only the collector frees
        return 0

    gc.unfreeze()
    try:
        with socket.socket() as sock:
            assert frozen_after_each_task(task)(sock, True) == 0
        assert garbage[0]() is None, "the task's garbage cycle was frozen instead of collected"
        assert gc.get_freeze_count() > 0, "what outlived the task was not frozen"
    finally:
        gc.unfreeze()
