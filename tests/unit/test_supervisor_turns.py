"""The supervisor's turns to start its serving processes (coordinator_service.supervisor): once one process serves, a
process starts listening only once it serves too, and while none serves exactly one listens while it starts: when the
last one that served ends, one still starting without listening is told to listen at once.

A hypothesis state machine drives the supervisor's own `_turn`, `_started`, `_told` and `_ended` on an event loop, as
its keepers do (a keeper asks for a turn, starts its process with a real pipe to tell it to listen, the process tells
it serves through a real pipe, or ends), and checks each answer, and what each pipe says, against a model of the
processes."""

from __future__ import annotations

import asyncio
import os
import select
from enum import Enum, auto

from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from hypothesis.strategies import integers

from coordinator_service.supervisor import _SERVING, _Supervisor

PROCESSES = 4


class State(Enum):
    IDLE = auto()  # not running, its keeper not asking
    WAITING = auto()  # its keeper waits for a turn
    ANSWERING = auto()  # started listening while it starts (no other process served), or told to listen since
    GIVEN_QUIET = auto()  # given its turn to listen once it serves (another served), not started yet
    QUIET = auto()  # started to listen once it serves
    SERVING = auto()


class Turns(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.supervisor = _Supervisor([], 0, 0, None, "", self.stop)
        self.states = dict.fromkeys(range(PROCESSES), State.IDLE)
        self.turns: dict[int, asyncio.Task[bool | None]] = {}
        # The read end of each QUIET process's pipe, as the process holds it.
        self.listen_reads: dict[int, int] = {}

    def settle(self) -> None:
        """Run the loop until every keeper that can go on has, then take the turns given, each checked against the
        model as it was when it was given."""
        for _ in range(20):  # a keeper woken takes the condition's lock, then returns: a few loop turns each
            self.loop.run_until_complete(asyncio.sleep(0))
        for index, turn in list(self.turns.items()):
            if not turn.done():
                continue
            del self.turns[index]
            answers = turn.result()
            if answers is None:
                assert self.stop.is_set()
                self.states[index] = State.IDLE
                continue
            serving = [i for i, state in self.states.items() if state is State.SERVING]
            answering = [i for i, state in self.states.items() if state is State.ANSWERING]
            if answers:
                assert serving == [] and answering == [], (index, self.states)
                self.states[index] = State.ANSWERING
                self.start_process(index, answers)
            else:
                assert serving, (index, self.states)
                self.states[index] = State.GIVEN_QUIET

    def start_process(self, index: int, answers: bool) -> None:
        read, write = os.pipe()
        if answers:
            os.close(read)
        else:
            self.listen_reads[index] = read
            self.states[index] = State.QUIET
        self.loop.run_until_complete(self.supervisor._started(index, answers, write))
        self.take_listen_told()

    def take_listen_told(self) -> None:
        """A QUIET process the supervisor told to listen listens now; only it, and only when none serves or listens."""
        told = [index for index, read in self.listen_reads.items() if self.readable(read)]
        for index in told:
            assert self.states[index] is State.QUIET, (index, self.states)
            assert os.read(self.listen_reads.pop(index), 16) == b"listen", index
            assert State.SERVING not in self.states.values() and State.ANSWERING not in self.states.values()
            assert self.supervisor._answering_while_starting == index
            self.states[index] = State.ANSWERING
        assert len(told) <= 1, told

    @staticmethod
    def readable(fd: int) -> bool:
        return bool(select.select([fd], [], [], 0)[0])

    def forget_listen_read(self, index: int) -> None:
        read = self.listen_reads.pop(index, None)
        if read is not None:
            os.close(read)

    @rule(index=integers(0, PROCESSES - 1))
    def started(self, index: int) -> None:
        """A keeper given a turn to listen once its process serves starts it (meanwhile others may have ended)."""
        if self.states[index] is State.GIVEN_QUIET:
            self.start_process(index, False)

    @precondition(lambda self: not self.stop.is_set())
    @rule(index=integers(0, PROCESSES - 1))
    def ask(self, index: int) -> None:
        if self.states[index] is not State.IDLE:
            return
        self.states[index] = State.WAITING
        self.turns[index] = self.loop.create_task(self.supervisor._turn(index))
        self.settle()

    @rule(index=integers(0, PROCESSES - 1))
    def serves(self, index: int) -> None:
        if self.states[index] not in (State.ANSWERING, State.QUIET):
            return
        read, write = os.pipe()
        os.write(write, _SERVING.encode())
        os.close(write)
        assert self.loop.run_until_complete(self.supervisor._told(index, read)) == _SERVING
        self.states[index] = State.SERVING
        if index in self.listen_reads:  # its pipe is closed: it will never be told to listen
            assert self.readable(self.listen_reads[index]) and os.read(self.listen_reads[index], 16) == b""
            self.forget_listen_read(index)
        self.settle()

    @rule(index=integers(0, PROCESSES - 1), told=integers(0, 1))
    def ends(self, index: int, told: int) -> None:
        """The process exits: before it served (having told why, or nothing), or after."""
        if self.states[index] not in (State.ANSWERING, State.QUIET, State.SERVING):
            return
        if self.states[index] is not State.SERVING:
            read, write = os.pipe()
            os.write(write, b"cannot serve" if told else b"")
            os.close(write)
            self.loop.run_until_complete(self.supervisor._told(index, read))
        self.loop.run_until_complete(self.supervisor._ended(index))
        self.states[index] = State.IDLE
        self.forget_listen_read(index)
        self.take_listen_told()
        self.settle()

    @rule()
    def stopped(self) -> None:
        async def stop() -> None:
            self.stop.set()
            async with self.supervisor._turns:
                self.supervisor._turns.notify_all()

        self.loop.run_until_complete(stop())
        self.settle()

    @invariant()
    def a_running_process_listens(self) -> None:
        """While a process runs, one serves or one listens while it starts: the ports are never left without one."""
        if not hasattr(self, "states"):
            return
        if State.QUIET in self.states.values():
            assert {State.SERVING, State.ANSWERING} & set(self.states.values()), self.states

    @invariant()
    def no_keeper_waits_for_nothing(self) -> None:
        """A keeper waits only while another process listens while starting, and none serves."""
        if not hasattr(self, "states"):
            return
        waiting = [i for i, state in self.states.items() if state is State.WAITING]
        if waiting:
            assert not self.stop.is_set()
            assert [i for i, state in self.states.items() if state is State.ANSWERING], self.states
            assert State.SERVING not in self.states.values(), self.states

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            for turn in self.turns.values():
                turn.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()
            for index in list(self.listen_reads):
                self.forget_listen_read(index)


TestTurns = Turns.TestCase
TestTurns.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
