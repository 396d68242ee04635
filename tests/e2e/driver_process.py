"""A Spark driver in a process of its own, for the crash and stop tests: the `sink-writer` job, SIGKILLed or
SIGTERMed at a named point.

    python -m tests.e2e.driver_process POINT EPOCH -- <sink-writer flags>

Points (the library knows nothing of them: they wrap the coordinator client's calls):

* ``none``: run the job to its end;
* ``after-precommit``: PreCommit(EPOCH) was answered PERSISTED, Spark has not written commits/EPOCH;
* ``before-checkpoint-report``: commits/EPOCH is written (the report is sent only after it), and
  CommitCheckpoint(EPOCH) is about to be sent;
* ``sigterm-after-precommit``: as ``after-precommit``, but SIGTERM to this process alone, as a supervisor
  stopping the job sends it;
* ``sigterm-while-starting``: RegisterWriter was answered and the query is being started: SIGTERM once the
  main thread waits on the JVM (inside a py4j call).

A kill takes the whole process group (this driver, its JVM, its Python workers),
as `kill -9` of a driver container would; the test starts the driver as a group leader.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any
from unittest import mock

from coordinator_service.contract.client import CoordinatorClient
from coordinator_service.contract.views import CheckpointResult, PreCommitOutcome, PreCommitResult, Registration
from spark_writer import job

POINTS = ("none", "after-precommit", "before-checkpoint-report", "sigterm-after-precommit", "sigterm-while-starting")
# How long the main thread must have been inside one py4j call: a call that long is the JVM at work, not a
# round trip that could end before the signal arrives.
JVM_CALL_SECONDS = 0.05


def kill_driver() -> None:
    os.killpg(0, signal.SIGKILL)


def terminate_driver() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def inside_py4j_call(thread_id: int) -> int | None:
    """The id of the py4j frame the thread waits in, if it waits on the JVM."""
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code.co_name == "send_command" and "py4j" in frame.f_code.co_filename:
            return id(frame)
        frame = frame.f_back
    return None


def terminate_inside_jvm_call() -> None:
    """SIGTERM this process once its main thread has been waiting on the JVM for JVM_CALL_SECONDS."""
    main = threading.main_thread().ident
    assert main is not None

    def watch() -> None:
        waiting, since = None, time.monotonic()
        while True:
            call = inside_py4j_call(main)
            if call is None or call != waiting:
                waiting, since = call, time.monotonic()
            elif time.monotonic() - since >= JVM_CALL_SECONDS:
                terminate_driver()
                return
            time.sleep(0.001)

    threading.Thread(target=watch, name="sigterm-inside-jvm-call", daemon=True).start()


def arm(point: str, epoch: int) -> None:
    pre_commit = CoordinatorClient.pre_commit
    commit_checkpoint = CoordinatorClient.commit_checkpoint
    register_writer = CoordinatorClient.register_writer
    stop = terminate_driver if point.startswith("sigterm-") else kill_driver

    def pre_commit_then_stop(
        client: CoordinatorClient, sink: str, batch: int, *args: Any, **kwargs: Any
    ) -> PreCommitResult:
        answer = pre_commit(client, sink, batch, *args, **kwargs)
        if batch == epoch and answer.outcome is PreCommitOutcome.PERSISTED:
            stop()
        return answer

    def kill_before_report(
        client: CoordinatorClient, sink: str, batch: int, *args: Any, **kwargs: Any
    ) -> CheckpointResult:
        if batch >= epoch:
            kill_driver()
        return commit_checkpoint(client, sink, batch, *args, **kwargs)

    def register_then_terminate(client: CoordinatorClient, *args: Any, **kwargs: Any) -> Registration:
        registration = register_writer(client, *args, **kwargs)
        terminate_inside_jvm_call()
        return registration

    if point in ("after-precommit", "sigterm-after-precommit"):
        mock.patch.object(CoordinatorClient, "pre_commit", pre_commit_then_stop).start()
    elif point == "before-checkpoint-report":
        mock.patch.object(CoordinatorClient, "commit_checkpoint", kill_before_report).start()
    elif point == "sigterm-while-starting":
        mock.patch.object(CoordinatorClient, "register_writer", register_then_terminate).start()


def main(argv: list[str]) -> None:
    point, epoch, separator, *job_args = argv
    if point not in POINTS or separator != "--":
        raise SystemExit(f"usage: driver_process {{{','.join(POINTS)}}} EPOCH -- <sink-writer flags>")
    arm(point, int(epoch))
    job.app(args=job_args)


if __name__ == "__main__":
    main(sys.argv[1:])
