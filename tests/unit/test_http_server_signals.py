"""The coordinator's HTTP server leaves SIGTERM and SIGINT to the coordinator (coordinator_service.app.HttpServer).

uvicorn's server put in handlers of its own while it served; a SIGTERM then also reached uvicorn, whose shutdown
raced the coordinator's, and the HTTP server could start closing before the coordinator logged that it was stopping
(tests/integration/test_logging.py failed so under load: uvicorn's "Shutting down" among the commit path's lines)."""

from __future__ import annotations

import signal

import uvicorn

from coordinator_service.app import HttpServer


async def _app(scope: object, receive: object, send: object) -> None:  # an ASGI app that is never called
    raise AssertionError("not called")


def test_serving_http_puts_in_no_signal_handler() -> None:
    handled = (signal.SIGINT, signal.SIGTERM)
    before = {signum: signal.getsignal(signum) for signum in handled}
    server = HttpServer(uvicorn.Config(_app, lifespan="off", log_config=None))

    with server.capture_signals():  # what serve() runs in
        assert {signum: signal.getsignal(signum) for signum in handled} == before
