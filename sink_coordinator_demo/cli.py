"""`python -m sink_coordinator_demo` (`make demo`): the whole pipeline on one machine, with nothing configured.

It starts the coordinator (embedded PostgreSQL and SQL catalog in ./.sink-coordinator)
and a local Kafka-protocol broker, produces a stream of order events, streams them
into a new Iceberg table with the Spark writer in several micro-batches, then reads
the table back and shows that every order is there exactly once. Each run uses a
new topic, sink and table; --reset starts from an empty data directory. Flags point
it at a real Kafka, PostgreSQL or catalog instead, keep the table on a local S3 server
with its Iceberg REST catalog (--s3; --glue: Glue on an emulator instead), run Spark on
a standalone cluster started here (--cluster), or
route the orders by country into a table per country (--fan-out), each checked to
hold its country's orders only, and all of them every order exactly once. With --cdc the
stream is a database's changes of orders in Debezium's envelope instead
(sink_coordinator_demo/order_changes.py), mirrored into a keyed table checked against
the model: each existing order once, at its last change, and no deleted order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import warnings
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Final

import typer
from pydantic import SecretStr
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from rich.progress import Progress, TaskID

from coordinator_service.contract.client import CoordinatorClient
from coordinator_service.contract.flag_values import KEY_VALUE, KeyValue, parse_key_value
from coordinator_service.contract.logs import LogFormat, LogLevel, configure_logging
from coordinator_service.log.embedded import stop_embedded_postgres
from coordinator_service.runtime import catalog_properties, metastore_url, open_catalog
from coordinator_service.settings import Settings
from coordinator_service.tables.catalog_access import CatalogAccess
from sink_coordinator_demo.console_output import (
    Phases,
    console,
    exactly_once_results,
    print_summary,
    progress_bar,
    read_the_table,
    while_serving,
)
from sink_coordinator_demo.local_services import CoordinatorService, LocalProcess, NoidaKafkaBroker, ServiceError
from sink_coordinator_demo.object_store import emulated_object_store, local_object_store
from sink_coordinator_demo.order_changes import (
    MUTATIONS,
    ORDER_ROW_DDL,
    OrderModel,
    change_results,
    check_changes,
    produce_order_changes,
)
from sink_coordinator_demo.orders import ORDER_SCHEMA_DDL, create_topic, produce_orders
from sink_coordinator_demo.ports import free_port, port_is_free
from sink_coordinator_demo.spark_start import SparkStart
from sink_coordinator_demo.table_check import check_routes, check_table, fan_out_routes, route_tables
from spark_writer.driver_jvm import SparkLog
from spark_writer.job import run_until_done, start_job
from spark_writer.job_records import streams_ranges
from spark_writer.job_settings import KafkaSettings, KafkaSource, ParseSettings, SinkSettings
from spark_writer.kafka.offsets import offsets_covered
from spark_writer.stop_signals import StopRequest, stop_on_signals
from spark_writer.worker_logging import set_worker_log_level

DEFAULT_EVENTS: Final = 100_000
DEFAULT_BATCHES: Final = 8
# How often the progress bar looks at the query's last progress.
PROGRESS_POLL_SECONDS: Final = 0.2

app = typer.Typer(
    name="sink-coordinator-demo",
    help="Kafka -> Spark -> Iceberg exactly once, through the sink coordinator, on this machine.",
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's own help, as wide as the terminal up to 120 columns: rich's boxes cut the flags' names.
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


class BatchProgress:
    """Advances a progress bar by the records of each micro-batch of a query, from its last progress, read by a
    thread of its own every PROGRESS_POLL_SECONDS. Not a StreamingQueryListener: PySpark builds each event of a
    listener from the JVM's objects call by call, about 0.3 s of the driver's CPU per batch
    (spark_writer.sink.checkpoint_reporter)."""

    def __init__(self, query: StreamingQuery, progress: Progress, task: TaskID) -> None:
        self._query = query
        self._progress = progress
        self._task = task
        self._batch = -1
        self._end: dict[str, Any] | None = None  # the end offsets of the last batch shown
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-progress", daemon=True)

    def __enter__(self) -> BatchProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(PROGRESS_POLL_SECONDS):
            self.show()

    def show(self) -> None:
        """Advance by the batches the query ran since the last look. By the offsets they covered: the writer's tasks
        read the records of a stream of offset ranges themselves (spark_writer.kafka.range_source), and Spark counts
        the ranges. From the last batch shown's end, so that batches that ran between two looks count too."""
        last = self._query.lastProgress
        if last is None or last.batchId <= self._batch or not last.sources:
            return
        end = json.loads(last.json)["sources"][0]["endOffset"]
        records = offsets_covered(self._end, end)
        self._batch, self._end = last.batchId, end
        if records:
            self._progress.update(self._task, advance=records, description=f"micro-batch {last.batchId}")


def quiet_spark() -> None:
    """Keep Spark's start-up chatter out of the demo's output (the summary is what matters)."""
    logging.getLogger("py4j").setLevel(logging.WARNING)
    set_worker_log_level(LogLevel.WARNING.value)
    # Without it Spark warns that the host name resolves to a loopback address, which is what we want here.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")


def reset_data_dir(data_dir: Path) -> None:
    """Stop the embedded PostgreSQL of the data directory (if it runs) and delete the directory."""
    if (data_dir / "postgres" / "postmaster.pid").exists():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # embedded-postgres warns that XDG_RUNTIME_DIR is unset
            stop_embedded_postgres(data_dir / "postgres")
    shutil.rmtree(data_dir, ignore_errors=True)
    console.print(f"[yellow]reset:[/yellow] deleted {data_dir}")


def stream_orders(
    spark: SparkSession, kafka: KafkaSettings, parse: ParseSettings, sink: SinkSettings, events: int, stop: StopRequest
) -> None:
    """Run the writer until the topic is drained, with a progress bar fed by the query's last progress."""
    with progress_bar("stream") as progress:
        task = progress.add_task("starting", total=events)
        running = start_job(spark, kafka, parse, sink)
        with BatchProgress(running.query, progress, task):
            if not run_until_done(running, stop):
                raise KeyboardInterrupt
        # The table check counts the records.
        progress.update(task, completed=events, description="drained")


@app.callback(invoke_without_command=True)
def main(
    context: typer.Context,
    events: Annotated[int, typer.Option(min=1, help="Order events to produce.")] = DEFAULT_EVENTS,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions of the new topic.")] = 4,
    max_offsets_per_trigger: Annotated[
        int | None, typer.Option(min=1, help=f"Records per micro-batch; default: events / {DEFAULT_BATCHES}.")
    ] = None,
    bootstrap_servers: Annotated[
        str | None,
        typer.Option(
            help="A real Kafka; default: a local noida-db broker in DATA_DIR/kafka, its data deleted when the demo "
            "ends."
        ),
    ] = None,
    replication_factor: Annotated[int, typer.Option(min=1, help="Replication of the new topic.")] = 1,
    database_url: Annotated[
        str | None, typer.Option(help="PostgreSQL for the coordinator; default: the embedded one in DATA_DIR.")
    ] = None,
    catalog: Annotated[
        list[KeyValue] | None,
        typer.Option(
            help="pyiceberg catalog property key=value (repeat); default: SQL catalog.",
            parser=parse_key_value,
            metavar=KEY_VALUE,
        ),
    ] = None,
    data_dir: Annotated[Path, typer.Option(help="Where the embedded services keep their data.")] = Path(
        ".sink-coordinator"
    ),
    grpc_port: Annotated[int, typer.Option(help="Coordinator gRPC port (another one if taken).")] = 50051,
    http_port: Annotated[int, typer.Option(help="Coordinator admin API port (another one if taken).")] = 8080,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
    cluster: Annotated[
        bool,
        typer.Option(
            help="Run Spark on a standalone cluster started here (a master and a worker from the PySpark wheel, "
            "logs in DATA_DIR/spark-cluster): executors in JVMs of their own. Overrides --master."
        ),
    ] = False,
    s3: Annotated[
        bool,
        typer.Option(
            help="Keep the table on S3: an S3 server with an Iceberg REST catalog (SeaweedFS, the demo extra) "
            "started here holds it, in its REST catalog, and the executors write there (--storage). Its ports "
            "are new every run, so the run uses DATA_DIR/s3, emptied first."
        ),
    ] = False,
    glue: Annotated[
        bool,
        typer.Option(
            help="With --s3: the table in AWS Glue instead, on moto's S3 and Glue emulator (the demo extra), "
            "whose contents go with the demo."
        ),
    ] = False,
    fan_out: Annotated[
        bool,
        typer.Option(
            help="Route the orders by country: DE, FR, ES, GB and US into a table each (created by the writer), "
            "the others into the sink's own table; every table is checked to hold its countries' orders only."
        ),
    ] = False,
    cdc: Annotated[
        bool,
        typer.Option(
            help="A change stream instead: Debezium's JSON envelopes of orders created, then paid, shipped and "
            "delivered, or cancelled and some deleted, mirrored into a table keyed by order_id (--mode cdc); the "
            "table is checked to hold each existing order once, at its last change, and no deleted one. --events "
            "counts the changes."
        ),
    ] = False,
    reset: Annotated[bool, typer.Option(help="Delete DATA_DIR first (its PostgreSQL, warehouse, broker).")] = False,
    keep_serving: Annotated[
        bool, typer.Option(help="After the summary, keep the coordinator up (admin API) until Ctrl-C.")
    ] = False,
) -> None:
    """Produce order events, stream them into a new Iceberg table exactly once, and check the table."""
    if context.invoked_subcommand is not None:
        return
    configure_logging(LogLevel.WARNING, LogFormat.CONSOLE)
    quiet_spark()
    # SIGTERM stops the demo as Ctrl-C does, by KeyboardInterrupt; while Spark runs, both only request a stop
    # (stop_on_signals below): an exception there would break py4j's connection to the JVM.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    configured_catalog = dict(catalog or ())
    if s3 and configured_catalog:
        raise typer.BadParameter("--s3 brings its own catalog (its REST catalog, or Glue): leave out --catalog")
    if glue and not s3:
        raise typer.BadParameter("--glue is where --s3 keeps the table: give --s3 with it")
    if cdc and fan_out:
        raise typer.BadParameter("--cdc and --fan-out are two demos: give one of them")
    # With --s3 the metastore's sinks name tables that live only as long as the emulator: a data dir of its own.
    data_dir = data_dir.resolve() / ("s3" if s3 else "")
    if reset or s3:
        reset_data_dir(data_dir)
    run = datetime.now().strftime("%Y%m%d_%H%M%S")
    kind = "order-changes" if cdc else "orders"
    topic, sink_name, table = f"demo-{kind}-{run}", f"demo-{kind}-{run}", f"demo.{kind.replace('-', '_')}_{run}"
    phases = Phases()
    services: list[LocalProcess] = []
    emulator = contextlib.ExitStack()
    where: dict[str, str] = {}
    storage: dict[str, str] = {}
    broker_data = data_dir / "kafka"
    parse = (
        ParseSettings(schema_ddl=ORDER_ROW_DDL, evolve_schema=False, mutations=MUTATIONS)
        if cdc
        else ParseSettings(schema_ddl=ORDER_SCHEMA_DDL, evolve_schema=False)
    )
    spark_log = SparkLog(data_dir / "logs" / "spark.log")
    spark_log.path.parent.mkdir(parents=True, exist_ok=True)
    # Spark starts beside the services and the producer (sink_coordinator_demo.spark_start).
    spark_start = SparkStart(
        master,
        data_dir / "spark-cluster" if cluster else None,
        spark_log,
        records_in_jvm=not streams_ranges(KafkaSource.PYTHON, parse),
    ).begin()
    try:
        if s3 and glue:
            with phases.phase("start the object store (moto: S3 and Glue)"):
                store = emulator.enter_context(emulated_object_store("sink-coordinator-demo"))
                configured_catalog = store.catalog_properties("glue", store.uri("warehouse"))
                storage = store.properties
                where["object store"] = f"{store.endpoint} (moto's S3 and Glue: gone when the demo ends)"
        elif s3:
            with phases.phase("start the object store (SeaweedFS: S3 and an Iceberg REST catalog)"):
                store = emulator.enter_context(local_object_store(data_dir / "object-store", "sink-coordinator-demo"))
                configured_catalog = store.catalog_properties("rest", "")
                storage = store.properties
                where["object store"] = (
                    f"{store.endpoint}, REST catalog {store.rest_uri} (SeaweedFS, data in {data_dir / 'object-store'})"
                )
        settings = Settings(
            data_dir=data_dir,
            database_url=None if database_url is None else SecretStr(database_url),
            catalog=configured_catalog,
        )
        coordinator_env = {
            **({"DATABASE_URL": database_url} if database_url else {}),
            **{f"CATALOG__{key}": value for key, value in configured_catalog.items()},
        }
        with phases.phase("start the coordinator (PostgreSQL, catalog)"):
            coordinator = CoordinatorService(data_dir, free_port(grpc_port), free_port(http_port), coordinator_env)
            services.append(coordinator)
            coordinator.wait_serving()
        if bootstrap_servers is None:
            with phases.phase("start the Kafka broker (noida-db)"):
                # Each run's topic is its own: what an earlier run (or one killed) left is of no use, and takes disk.
                shutil.rmtree(broker_data, ignore_errors=True)
                broker = NoidaKafkaBroker(broker_data, free_port(9092))
                services.append(broker)
                broker.wait_ready()
                bootstrap_servers = broker.bootstrap
                where["Kafka topic"] = (
                    f"{topic} on {bootstrap_servers} (the demo's broker: stopped, and its data deleted, when the demo "
                    "ends; `python -m sink_coordinator_demo broker` runs one for your own topics)"
                )
        model: OrderModel | None = None
        with (
            phases.phase(f"produce {events:,} {'changes of orders' if cdc else 'orders'}"),
            progress_bar("produce") as progress,
        ):
            create_topic(bootstrap_servers, topic, partitions, replication_factor)
            task = progress.add_task(topic, total=events)
            if cdc:
                model = produce_order_changes(bootstrap_servers, topic, events, lambda n: progress.advance(task, n))
            else:
                produce_orders(bootstrap_servers, topic, events, lambda n: progress.advance(task, n))
        sink = SinkSettings(
            sink=sink_name,
            table=table,
            coordinator=coordinator.target,
            checkpoint_location=str(data_dir / "checkpoints" / sink_name),
            available_now=True,
            storage=storage,
            routes=fan_out_routes(table) if fan_out else None,
        )
        kafka = KafkaSettings(
            bootstrap_servers,
            (topic,),
            max_offsets_per_trigger=max_offsets_per_trigger or -(-events // DEFAULT_BATCHES),
        )
        with phases.phase(f"start Spark{' on a standalone cluster' if cluster else ''} (in the background)"):
            spark = spark_start.wait()
        with stop_on_signals() as stop, phases.phase("stream into Iceberg"):
            # Debezium's tombstones are records too: the bar counts every record the query reads.
            stream_orders(spark, kafka, parse, sink, events + (model.deleted if model else 0), stop)
        with phases.phase("read the table back"):
            url, _ = metastore_url(settings)
            tables = route_tables(table, sink.routes)
            opened = open_catalog(settings, url)
            with CoordinatorClient(coordinator.target) as client:
                committed_epochs = client.sink_state(sink_name).committed_epoch + 1
            if model is None:
                check = check_table(opened, list(tables), sink_name, events)
                routes = check_routes(opened, tables) if sink.routes is not None else []
                results, ok = exactly_once_results(events, check, committed_epochs, routes)
                location = check.location
            else:
                changes = check_changes(opened, table, sink_name, model)
                results, ok, routes = change_results(events, changes, committed_epochs), changes.ok, []
                location = changes.location
            access = CatalogAccess(
                settings.catalog_name,
                catalog_properties(settings, url),
                table,
                opened.load_table(table).metadata_location,
            )
        print_summary(
            results,
            ok,
            settings,
            phases,
            {
                "Kafka topic": f"{topic} on {bootstrap_servers}",
                **where,
                ("Iceberg table (the sink's own)" if fan_out else "Iceberg table"): f"{table} in catalog "
                f"{settings.catalog_name!r} "
                + (
                    ("(Glue on the emulator)" if glue else "(the S3 server's REST catalog)")
                    if s3
                    else "(the configured one)"
                    if configured_catalog
                    else "(SQL catalog in the coordinator's PostgreSQL)"
                ),
                "table location": location,
                "read the table": "the lines below",
                "Spark checkpoint": sink.checkpoint_location,
                "console and admin API": f"{coordinator.admin_url}/console, {coordinator.admin_url}/api/v1/sinks "
                f"(docs: {coordinator.admin_url}/docs)" + while_serving(keep_serving, s3),
                "coordinator log": str(coordinator.log_path),
                "Spark log": str(spark_log.path),
            },
            read_the_table(access, data_dir, secrets_are_local=not (database_url or catalog)),
            routes,
        )
        if keep_serving:
            console.print(f"coordinator serving at {coordinator.admin_url}/docs: Ctrl-C to stop")
            with contextlib.suppress(KeyboardInterrupt):  # the way to end a successful demo here
                coordinator.process.wait()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping[/yellow]")
        raise typer.Exit(130) from None
    finally:
        spark_start.stop()
        for service in reversed(services):
            service.stop()
        if any(isinstance(service, NoidaKafkaBroker) for service in services):
            shutil.rmtree(broker_data, ignore_errors=True)
        emulator.close()


@app.command()
def broker(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the broker on 127.0.0.1.")] = 9092,
    data_dir: Annotated[Path, typer.Option(help="Where the broker keeps its topics (kept when it stops).")] = Path(
        ".sink-coordinator/broker"
    ),
) -> None:
    """Run a local Kafka-protocol broker (noida-db) for your own topics until Ctrl-C."""
    configure_logging(LogLevel.WARNING, LogFormat.CONSOLE)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if not port_is_free(port):
        console.print(f"[red]cannot start the broker:[/red] port {port} is in use: choose another with --port")
        raise typer.Exit(1)
    running = NoidaKafkaBroker(data_dir.resolve(), port)
    try:
        running.wait_ready()
        console.print(
            f"Kafka-protocol broker on {running.bootstrap} (topics in {data_dir}, its log {running.log_path}); stream "
            f"a topic of yours with `sink-writer --bootstrap-servers {running.bootstrap} --topic <topic> ...`. "
            "Ctrl-C stops it.",
            soft_wrap=True,
        )
        running.process.wait()
        raise ServiceError(f"the broker exited with status {running.process.returncode}; see {running.log_path}")
    except KeyboardInterrupt:
        console.print("broker stopped")
    except ServiceError as error:
        console.print(f"[red]{error}[/red]", soft_wrap=True)
        raise typer.Exit(1) from None
    finally:
        running.stop()
