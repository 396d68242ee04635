"""Python's cyclic collector paused for keyed commits (coordinator_service.engine.collector_pause): off while any
pause is open, across threads and however they overlap, then as it was before the first."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator_service.engine import collector_pause
from coordinator_service.engine.collector_pause import collector_paused


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


def test_the_collector_is_off_in_a_pause_and_back_after_it_even_when_the_block_raises() -> None:
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a commit failed")
    assert gc.isenabled()


def test_a_collector_off_before_the_pause_stays_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


# Each pause opens and closes in an order the test draws: pauses that end before or after those opened later, as two
# commits of other sinks overlap.
@given(st.permutations(list(range(6))), st.booleans())
def test_overlapping_pauses_keep_the_collector_off_until_the_last_closes(closing: list[int], enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    pauses = [collector_paused() for _ in closing]
    for pause in pauses:
        pause.__enter__()
    for count, number in enumerate(closing, start=1):
        assert not gc.isenabled()
        pauses[number].__exit__(None, None, None)
        if count < len(closing):
            assert not gc.isenabled()
    assert gc.isenabled() is enabled


def test_pauses_in_threads_leave_the_collector_as_it_was() -> None:
    gc.enable()
    inside = threading.Barrier(4)
    seen: list[bool] = []

    def commit() -> None:
        with collector_paused():
            inside.wait(10)
            seen.append(gc.isenabled())
            inside.wait(10)

    threads = [threading.Thread(target=commit) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == [False] * 4
    assert gc.isenabled()


def test_pauses_that_overlap_without_end_let_a_full_collection_run_now_and_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keyed commits of many sinks can keep some pause open at every moment: the collector still runs once the
    stretch passes MAX_OFF_SECONDS, and cycles made meanwhile are freed."""
    gc.enable()
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    freed = threading.Event()
    first = collector_paused()
    first.__enter__()
    cycle = Cycle()
    weakref.finalize(cycle, freed.set)
    del cycle
    for _ in range(3):  # each pause overlaps the next: some pause is open all along
        second = collector_paused()
        second.__enter__()
        first.__exit__(None, None, None)
        first = second
        assert not gc.isenabled()
    assert not freed.is_set()  # within the stretch: the cycle waits
    clock[0] = collector_pause.MAX_OFF_SECONDS + 1
    second = collector_paused()
    second.__enter__()
    first.__exit__(None, None, None)
    assert freed.is_set()  # the stretch passed: one full collection ran, the collector still off for the open pause
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()
