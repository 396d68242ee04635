"""One answer for many callers: concurrent callers share one computation, and a finished one serves for a while.

What anyone may ask as often as they like (/metrics, /readyz) then costs one computation per `fresh_seconds`
however many ask, and asks that arrive together never pile up computations of their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedAnswer(Generic[T]):
    def __init__(self, fresh_seconds: float) -> None:
        self._fresh_seconds = fresh_seconds
        self._task: asyncio.Task[T] | None = None
        self._finished_at = 0.0

    async def get(self, compute: Callable[[], Awaitable[T]]) -> T:
        """The answer being computed, or one finished less than fresh_seconds ago, or a new one by `compute`.
        A failed computation is not reused; a caller that gives up does not stop the others' computation."""
        task = self._task
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None or self._stale())):
            task = self._task = asyncio.create_task(self._run(compute), name="shared-answer")
        return await asyncio.shield(task)

    async def _run(self, compute: Callable[[], Awaitable[T]]) -> T:
        try:
            return await compute()
        finally:
            self._finished_at = time.monotonic()

    def _stale(self) -> bool:
        return time.monotonic() - self._finished_at >= self._fresh_seconds
