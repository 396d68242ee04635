"""A TCP proxy on 127.0.0.1 that delays every byte by a fixed time in each direction: far storage, nearby.

Each connection is piped both ways; every chunk read is written on after `delay_seconds`, in order,
without holding back the chunks behind it (a link's latency, not a lower bandwidth). The proxy runs its
own event loop in a daemon thread, so that synchronous and asynchronous clients both go through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field

CHUNK_BYTES = 64 * 1024


async def _delayed_pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def forward() -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not data:
                break
            writer.write(data)
            await writer.drain()

    forwarding = asyncio.create_task(forward())
    try:
        with contextlib.suppress(ConnectionError):  # a peer gone: the other side is closed too
            while data := await reader.read(CHUNK_BYTES):
                queue.put_nowait((loop.time() + delay, data))
    finally:
        queue.put_nowait((loop.time() + delay, b""))
        with contextlib.suppress(ConnectionError):
            await forwarding
        writer.close()


@dataclass
class LatencyProxy:
    """127.0.0.1:<port> -> target_host:target_port, `delay_seconds` added each way."""

    target_host: str
    target_port: int
    delay_seconds: float
    port: int = 0
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LatencyProxy:
        self._thread = threading.Thread(target=self._loop.run_forever, name="latency-proxy", daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._connection, "127.0.0.1", 0), self._loop
        ).result(timeout=10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def _connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _delayed_pipe(client_reader, target_writer, self.delay_seconds),
            _delayed_pipe(target_reader, client_writer, self.delay_seconds),
        )

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
