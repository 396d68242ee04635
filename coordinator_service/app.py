"""Wiring: one asyncio loop serving gRPC for writers and HTTP for operators."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

import grpc
import structlog
import uvicorn
from grpc_health.v1 import health_pb2

from coordinator_service import failpoints, listening, metrics
from coordinator_service.admin.api import create_app
from coordinator_service.admin.starting import AppSwitch, create_starting_app
from coordinator_service.contract.errors import CannotServe
from coordinator_service.grpc_gate import SERVICE_NAME, Serving
from coordinator_service.grpc_server import build_server
from coordinator_service.runtime import Runtime
from coordinator_service.settings import Settings
from coordinator_service.startup import Startup
from coordinator_service.supervisor import ServingProcess

log = structlog.get_logger(__name__)

GRACE_SECONDS = 5.0


class HttpServer(uvicorn.Server):
    """uvicorn's server without signal handlers of its own: the coordinator's stop alone decides the order of a
    shutdown (health NOT_SERVING, then the HTTP server, then gRPC). uvicorn's would also take SIGTERM, and then its
    shutdown raced the coordinator's: the HTTP server could start closing before the coordinator said it was
    stopping."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(
    settings: Settings, stop: asyncio.Event | None = None, *, process: ServingProcess | None = None
) -> None:
    """Listen, open the runtime once the metastore answers (answering probes and writers meanwhile), serve until
    SIGTERM/SIGINT (or `stop` is set), then drain and close. As one of a supervisor's serving `process`es, on the
    ports it reserved (shared with its other processes), telling it once it serves; one started while another
    serves opens its runtime first and listens once it serves (coordinator_service.supervisor)."""
    failpoints.configure(settings.failpoints)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    serving = Serving()
    startup = Startup(settings, told=serving.starting)
    try:
        if process is not None and not process.answers_while_starting:
            # Listens once it serves, unless the supervisor says no process serves any longer: then at once.
            told_to_listen = process.told_to_listen()
            await startup.open_runtime(stop, until=told_to_listen)
            if told_to_listen.is_set() and startup.runtime is None:
                log.warning("no serving process is left: listening while the runtime opens")
        if not stop.is_set():
            await _listen_and_serve(settings, stop, process, serving, startup)
    finally:
        await startup.close()
        log.info("sink-coordinator stopped")


async def _listen_and_serve(
    settings: Settings,
    stop: asyncio.Event,
    process: ServingProcess | None,
    serving: Serving,
    startup: Startup,
) -> None:
    """Listen and serve until the stop: with the startup's runtime open already (listening once serving), or opening
    it meanwhile."""
    runtime = startup.runtime
    tls_credentials = _grpc_tls_credentials(settings)
    shared = process is not None
    http_socket = listening.bind(settings.bind_host, settings.http_port, "HTTP", shared=shared)
    try:
        if not shared:
            listening.check_free(settings.bind_host, settings.grpc_port, "gRPC")
    except BaseException:
        http_socket.close()
        raise
    grpc_server, health, grpc_port = build_server(
        serving, f"{settings.bind_host}:{settings.grpc_port}", settings, tls_credentials, shared_port=shared
    )
    http_port = http_socket.getsockname()[1]
    switch = AppSwitch(create_starting_app(settings, lambda: startup.waiting))
    http = HttpServer(
        uvicorn.Config(
            switch,
            host=settings.bind_host,
            port=settings.http_port,
            log_config=None,
            access_log=False,
            lifespan="off",
            # X-Forwarded-For names the operator only from a proxy the settings trust (uvicorn would believe
            # 127.0.0.1, where kubectl port-forward arrives from).
            proxy_headers=bool(settings.trusted_proxies),
            forwarded_allow_ips=settings.trusted_proxies or None,
            ssl_certfile=settings.tls_cert_file,
            ssl_keyfile=settings.tls_key_file,
        )
    )

    async def open_(runtime: Runtime) -> None:
        switch.app = create_app(runtime)
        serving.open(runtime.coordinator, settings.admin_lock_timeout_seconds)
        runtime.start()
        for service in ("", SERVICE_NAME):
            await health.set(service, health_pb2.HealthCheckResponse.SERVING)

    for service in ("", SERVICE_NAME):
        await health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    if runtime is not None:
        await open_(runtime)
    await grpc_server.start()
    http_task = asyncio.create_task(http.serve(sockets=[http_socket]), name="http")
    lag = asyncio.create_task(metrics.watch_event_loop_lag(), name="event-loop-lag")
    try:
        while not http.started:
            if http_task.done():
                raise CannotServe(
                    f"the HTTP server on {settings.bind_host}:{http_port} did not start: see the log above"
                )
            await asyncio.sleep(0.01)
        if runtime is None:
            log.info(
                "sink-coordinator listening; opening the metastore",
                grpc=f"{settings.bind_host}:{grpc_port}",
                http=f"{'https' if tls_credentials else 'http'}://{settings.bind_host}:{http_port}",
            )
            runtime = await startup.open_runtime(stop)
            if runtime is not None:
                await open_(runtime)
        if runtime is not None:
            log.info(
                "sink-coordinator serving",
                grpc=f"{settings.bind_host}:{grpc_port}",
                http=f"{'https' if tls_credentials else 'http'}://{settings.bind_host}:{http_port}",
                tls=tls_credentials is not None,
                writer_auth=settings.writer_token is not None or bool(settings.writer_scopes),
                writer_scopes=sorted(settings.writer_scopes),
                admin_auth=settings.admin_token is not None,
                admin_read_auth=settings.admin_read_requires_token,
            )
            if process is not None:
                process.tell_serving()
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({stopped, http_task}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
    finally:
        log.info("sink-coordinator stopping")
        await health.enter_graceful_shutdown()
        http.should_exit = True
        await grpc_server.stop(GRACE_SECONDS)
        await asyncio.gather(http_task, return_exceptions=True)
        lag.cancel()


def _grpc_tls_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    try:
        certificate_chain = settings.tls_cert_file.read_bytes()
        private_key = settings.tls_key_file.read_bytes()
    except OSError as error:
        raise OSError(f"cannot read the TLS certificate or key: {error}") from error
    return grpc.ssl_server_credentials([(private_key, certificate_chain)])
