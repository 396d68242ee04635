"""Several serving processes behind one pair of ports (PROCESSES > 1), so that one coordinator uses every core.

`sink-coordinator serve` with PROCESSES > 1 is this supervisor: it reserves both ports (coordinator_service.listening:
any other coordinator is refused them), starts PROCESSES serving processes, each a whole coordinator as with one
process (its runtime, gRPC and HTTP servers, background work) listening on the ports with SO_REUSEPORT, and keeps
them running. They share the metastore exactly as replicas do: the committer, the cleaner, maintenance and
verification spread over them by the per-sink commit lock and the leases, and the kernel spreads the connections.

- A serving process is the same command again (`python -m coordinator_service.cli` with the supervisor's arguments,
  its environment), told its index, the ports and a pipe in PROCESS_VARIABLE; it writes to the pipe once it serves.
- Once one process serves, every connection reaches a serving one. A process started while another serves (the
  others at the first start, a process started again) listens only once it serves: before, a probe or a writer
  reaching it read "not ready" from a coordinator that was. One process alone listens while it starts, so that a
  coordinator waiting for its metastore answers its probes (live, not ready) and its writers (UNAVAILABLE): the
  first one started while none serves or is starting so (`ServingProcess.answers_while_starting`); the others are
  started once it serves. When the last process that served ends while others are starting without listening, one of
  them is told to listen at once (`ServingProcess.told_to_listen`, through a pipe of its own): the ports never go
  without a listener while a process runs.
- Metrics: the processes count in prometheus_client's multiprocess files (PROMETHEUS_MULTIPROC_DIR, a directory of
  the supervisor's own, removed when it stops), so that a scrape answered by any of them has the whole
  coordinator's counters and histograms (coordinator_service.metrics.scrape).
- The embedded metastore is started and migrated here, once, and the processes are given its URL.
- A process that dies (a signal, or an exit after it served) is started again after a back-off; one that exits by
  itself before it served could not start (a port, the configuration, the schema: it writes why to its pipe), and
  the supervisor stops the others and ends with that refusal, one line, instead of starting it again and again.
- SIGTERM or SIGINT: each process is told SIGTERM and stops as a single coordinator does (drain, bounded close);
  the supervisor exits 0 once all have.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Final, Self

import structlog
from pydantic import SecretStr

from coordinator_service import listening
from coordinator_service.contract.errors import CannotServe
from coordinator_service.metrics.scrape import METRICS_DIRECTORY_VARIABLE
from coordinator_service.settings import Settings

log = structlog.get_logger(__name__)

# The variable that makes `serve` a serving process of a supervisor (JSON of ServingProcess). Not a setting: the
# supervisor sets it.
PROCESS_VARIABLE: Final = "_SINK_COORDINATOR_PROCESS"

# The wait before a process that died is started again, doubling up to the longest while it keeps dying; a process
# that served STEADY_SECONDS before it died waits the first again.
FIRST_RESTART_SECONDS: Final = 0.5
LONGEST_RESTART_SECONDS: Final = 30.0
STEADY_SECONDS: Final = 60.0
# How long a process told SIGTERM may take to stop (its drain and its bounded close) before it is killed.
STOP_SECONDS: Final = 60.0


@dataclass(frozen=True)
class ServingProcess:
    """What a serving process is told by its supervisor."""

    index: int
    grpc_port: int
    http_port: int
    # The pipe's end the process writes to once it serves.
    serving_fd: int
    supervisor_pid: int
    # Whether it listens while it opens its runtime (no other process serves), or only once it serves.
    answers_while_starting: bool
    # The pipe's end the supervisor writes to (or closes) when a process that does not listen yet must listen at once.
    listen_fd: int
    # The embedded metastore the supervisor started (None: the configured one).
    database_url: str | None = None

    @classmethod
    def from_environment(cls) -> Self | None:
        """This process's, when a supervisor started it."""
        told = os.environ.get(PROCESS_VARIABLE)
        return None if told is None else cls(**json.loads(told))

    def settings(self, settings: Settings) -> Settings:
        """The settings as this process serves them: the supervisor's ports (port 0 resolved), its metastore."""
        update: dict[str, object] = {"grpc_port": self.grpc_port, "http_port": self.http_port}
        if self.database_url is not None:
            update["database_url"] = SecretStr(self.database_url)
        return settings.model_copy(update=update)

    def follow_supervisor(self) -> None:
        """Be told SIGTERM when the supervisor dies (killed -9, say): a serving process never outlives it."""
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != self.supervisor_pid:  # the supervisor died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    def told_to_listen(self) -> asyncio.Event:
        """Set once the supervisor tells this process, started to listen only once it serves, to listen at once: the
        last process that served ended, and no other listens."""
        told = asyncio.Event()
        loop = asyncio.get_running_loop()

        def read() -> None:
            loop.remove_reader(self.listen_fd)
            told.set()

        loop.add_reader(self.listen_fd, read)
        return told

    def tell_serving(self) -> None:
        self._tell(_SERVING)

    def tell_refusal(self, error: BaseException) -> None:
        """Why this process cannot serve: the supervisor ends with it."""
        self._tell(str(error))

    def _tell(self, told: str) -> None:
        with contextlib.suppress(OSError):  # the supervisor is gone: it will not ask
            os.write(self.serving_fd, told.encode())
            os.close(self.serving_fd)


# What a serving process writes to its pipe once it serves (anything else: why it cannot).
_SERVING: Final = "serving"


class StartFailed(Exception):
    """A serving process exited by itself before it served: starting it again would fail again."""

    def __init__(self, index: int, status: int, told: str) -> None:
        super().__init__(told or f"serving process {index} exited with status {status} before it served: see its log")


async def supervise(settings: Settings, arguments: list[str]) -> None:
    """Run settings.processes serving processes of `arguments` (the command line after the program) until SIGTERM or
    SIGINT. CannotServe: a port is taken, or a process could not start (its refusal)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reserved: list[socket.socket] = []
    metrics_directory = tempfile.mkdtemp(prefix="sink-coordinator-metrics-")
    try:
        reserved.append(listening.reserve(settings.bind_host, settings.http_port, "HTTP"))
        reserved.append(listening.reserve(settings.bind_host, settings.grpc_port, "gRPC"))
        http_port, grpc_port = (sock.getsockname()[1] for sock in reserved)
        database_url = await asyncio.to_thread(_embedded_metastore, settings)
        supervisor = _Supervisor(arguments, grpc_port, http_port, database_url, metrics_directory, stop)
        log.info(
            "sink-coordinator starting its serving processes",
            processes=settings.processes,
            grpc=f"{settings.bind_host}:{grpc_port}",
            http=f"{settings.bind_host}:{http_port}",
        )
        await supervisor.run(settings.processes)
    finally:
        for sock in reserved:
            sock.close()
        shutil.rmtree(metrics_directory, ignore_errors=True)


def _embedded_metastore(settings: Settings) -> str | None:
    """The embedded metastore's URL, started and migrated once for every process; None: a configured one."""
    if settings.database_url is not None:
        return None
    from coordinator_service.runtime import metastore_url, migrate

    url, _ = metastore_url(settings)
    revision = migrate(url)
    log.info("embedded metastore migrated", revision=revision, data_dir=str(settings.data_dir))
    return url.render_as_string(hide_password=False)


class _Supervisor:
    def __init__(
        self,
        arguments: list[str],
        grpc_port: int,
        http_port: int,
        database_url: str | None,
        metrics_directory: str,
        stop: asyncio.Event,
    ) -> None:
        self._arguments = arguments
        self._grpc_port = grpc_port
        self._http_port = http_port
        self._database_url = database_url
        self._metrics_directory = metrics_directory
        self._stop = stop
        self._running: dict[int, asyncio.subprocess.Process] = {}
        # The processes that told they serve, and the one that listened while it started (none served then, or it
        # was told to listen when the last one that served ended), until it ends: a turn waits on it only while none
        # serves.
        self._serving: set[int] = set()
        self._answering_while_starting: int | None = None
        # The processes started to listen once they serve that do not serve yet: the end of each one's pipe that
        # tells it to listen at once.
        self._quiet: dict[int, int] = {}
        self._turns = asyncio.Condition()

    async def run(self, processes: int) -> None:
        keepers = [asyncio.create_task(self._keep(index), name=f"process-{index}") for index in range(processes)]
        stopped = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait({stopped, *keepers}, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopped}:
                error = task.exception()
                if isinstance(error, StartFailed):
                    raise CannotServe(str(error)) from None  # said last, once the others stopped
                if error is not None:
                    raise error
        finally:
            self._stop.set()
            async with self._turns:  # a keeper waiting for its turn to start sees the stop
                self._turns.notify_all()
            log.info("sink-coordinator stopping its serving processes", processes=len(self._running))
            for process in self._running.values():
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
            await asyncio.gather(*keepers, return_exceptions=True)
            stopped.cancel()
            log.info("sink-coordinator stopped")

    async def _keep(self, index: int) -> None:
        """Keep serving process `index` running until the stop; StartFailed when it cannot start."""
        wait = FIRST_RESTART_SECONDS
        while not self._stop.is_set():
            answers_while_starting = await self._turn(index)
            if answers_while_starting is None:
                return
            started = time.monotonic()
            status, told = await self._run(index, answers_while_starting)
            served = told == _SERVING
            if self._stop.is_set():
                return
            if status > 0 and not served:
                raise StartFailed(index, status, told)
            if time.monotonic() - started >= STEADY_SECONDS:
                wait = FIRST_RESTART_SECONDS
            log.error(
                "a serving process ended unexpectedly; starting it again",
                process=index,
                exit_status=status,
                served=served,
                restart_in_seconds=wait,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait)
            wait = min(wait * 2, LONGEST_RESTART_SECONDS)

    async def _turn(self, index: int) -> bool | None:
        """Once process `index` may start: whether it answers while it starts (no process serves, and none is starting
        so), or listens once it serves (another serves). Waits while another starts answering; None: the stop."""
        async with self._turns:
            await self._turns.wait_for(
                lambda: self._stop.is_set() or bool(self._serving) or self._answering_while_starting is None
            )
            if self._stop.is_set():
                return None
            if self._serving:
                return False
            self._answering_while_starting = index
            return True

    async def _told(self, index: int, serving_read: int) -> str:
        """What process `index` wrote to its pipe, once it closed it; once it serves, every turn is given."""
        told = (await asyncio.to_thread(_read_all, serving_read)).decode(errors="replace")
        if told == _SERVING:
            async with self._turns:
                self._serving.add(index)
                _close(self._quiet.pop(index, None))
                self._turns.notify_all()
        return told

    async def _started(self, index: int, answers_while_starting: bool, listen_write: int) -> None:
        """Process `index` runs; `listen_write` is the end of its pipe that tells it to listen at once. One started not
        to listen is told so at once if the process that served ended while it was being started."""
        async with self._turns:
            if answers_while_starting:
                _close(listen_write)
                return
            self._quiet[index] = listen_write
            self._listen_if_none_does()

    async def _ended(self, index: int) -> None:
        async with self._turns:
            self._serving.discard(index)
            _close(self._quiet.pop(index, None))
            if self._answering_while_starting == index:
                self._answering_while_starting = None
            self._listen_if_none_does()
            self._turns.notify_all()

    def _listen_if_none_does(self) -> None:
        """When no process serves and none listens while it starts, one of those started to listen once they serve is
        told to listen at once (under the turns' lock): before, the ports refused every connection until the process
        that ended was started again and listened."""
        if self._serving or self._answering_while_starting is not None or not self._quiet:
            return
        index, listen_write = self._quiet.popitem()
        with contextlib.suppress(OSError):  # it ended meanwhile: its keeper's _ended follows
            os.write(listen_write, b"listen")
        _close(listen_write)
        self._answering_while_starting = index
        log.warning("no serving process is left; one still starting listens at once", process=index)

    async def _run(self, index: int, answers_while_starting: bool) -> tuple[int, str]:
        """Run process `index` once: its exit status (negative: the signal that ended it), and what it told (serving,
        or why it cannot)."""
        serving_read, serving_write = os.pipe()
        listen_read, listen_write = os.pipe()
        serving = ServingProcess(
            index=index,
            grpc_port=self._grpc_port,
            http_port=self._http_port,
            serving_fd=serving_write,
            supervisor_pid=os.getpid(),
            answers_while_starting=answers_while_starting,
            listen_fd=listen_read,
            database_url=self._database_url,
        )
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "coordinator_service.cli",
                *self._arguments,
                env={
                    **os.environ,
                    PROCESS_VARIABLE: json.dumps(asdict(serving)),
                    METRICS_DIRECTORY_VARIABLE: self._metrics_directory,
                },
                pass_fds=(serving_write, listen_read),
                stdin=asyncio.subprocess.DEVNULL,
            )
        except BaseException:
            os.close(listen_write)
            raise
        finally:
            os.close(serving_write)
            os.close(listen_read)
        self._running[index] = process
        log.info("serving process started", process=index, pid=process.pid)
        try:
            await self._started(index, answers_while_starting, listen_write)
            reading = asyncio.create_task(self._told(index, serving_read))
            if self._stop.is_set():  # the stop came while it was being started
                process.send_signal(signal.SIGTERM)
            try:
                status = await _exit_after_stop(process, self._stop)
            finally:
                told = await reading
        finally:
            del self._running[index]
            await self._ended(index)
            _forget_process(self._metrics_directory, process.pid)
        return status, told


def _close(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


async def _exit_after_stop(process: asyncio.subprocess.Process, stop: asyncio.Event) -> int:
    """The process's exit status; once the stop is set it has STOP_SECONDS to exit before it is killed."""
    exited = asyncio.create_task(process.wait())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not exited.done():
        try:
            return await asyncio.wait_for(asyncio.shield(exited), STOP_SECONDS)
        except TimeoutError:
            log.error("a serving process did not stop in time; killing it", pid=process.pid, seconds=STOP_SECONDS)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    return await exited


def _read_all(fd: int) -> bytes:
    """What a process wrote to its pipe, once it closed it (wrote it serves) or exited."""
    with os.fdopen(fd, "rb") as pipe:
        return pipe.read()


def _forget_process(metrics_directory: str, pid: int) -> None:
    """The live gauges of a process that exited leave the scrape (its counters stay in the totals)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, metrics_directory)  # type: ignore[no-untyped-call]
