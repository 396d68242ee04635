"""A Spark driver in a process of its own, for the crash tests: the `sink-writer` job, SIGKILLed at a named point.

    python -m tests.e2e.driver_process KILL_POINT EPOCH -- <sink-writer flags>

Kill points (the library knows nothing of them: they wrap the coordinator client's calls):

* ``none``: run the job to its end;
* ``after-precommit``: PreCommit(EPOCH) was answered PERSISTED, Spark has not written commits/EPOCH;
* ``before-checkpoint-report``: commits/EPOCH is written (the report is sent only after it), and
  CommitCheckpoint(EPOCH) is about to be sent.

The kill takes the whole process group (this driver, its JVM, its Python workers),
as `kill -9` of a driver container would; the test starts the driver as a group leader.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any
from unittest import mock

from coordinator_service.client import CoordinatorClient
from coordinator_service.views import CheckpointResult, PreCommitOutcome, PreCommitResult
from spark_writer import job

KILL_POINTS = ("none", "after-precommit", "before-checkpoint-report")


def kill_driver() -> None:
    os.killpg(0, signal.SIGKILL)


def arm(kill_point: str, epoch: int) -> None:
    pre_commit = CoordinatorClient.pre_commit
    commit_checkpoint = CoordinatorClient.commit_checkpoint

    def pre_commit_then_kill(
        client: CoordinatorClient, sink: str, batch: int, *args: Any, **kwargs: Any
    ) -> PreCommitResult:
        answer = pre_commit(client, sink, batch, *args, **kwargs)
        if batch == epoch and answer.outcome is PreCommitOutcome.PERSISTED:
            kill_driver()
        return answer

    def kill_before_report(
        client: CoordinatorClient, sink: str, batch: int, *args: Any, **kwargs: Any
    ) -> CheckpointResult:
        if batch >= epoch:
            kill_driver()
        return commit_checkpoint(client, sink, batch, *args, **kwargs)

    if kill_point == "after-precommit":
        mock.patch.object(CoordinatorClient, "pre_commit", pre_commit_then_kill).start()
    elif kill_point == "before-checkpoint-report":
        mock.patch.object(CoordinatorClient, "commit_checkpoint", kill_before_report).start()


def main(argv: list[str]) -> None:
    kill_point, epoch, separator, *job_args = argv
    if kill_point not in KILL_POINTS or separator != "--":
        raise SystemExit(f"usage: driver_process {{{','.join(KILL_POINTS)}}} EPOCH -- <sink-writer flags>")
    arm(kill_point, int(epoch))
    job.app(args=job_args)


if __name__ == "__main__":
    main(sys.argv[1:])
