"""Client input that PostgreSQL, the catalog or the transport cannot take is INVALID_ARGUMENT, and changes nothing.

NUL bytes, over-long names, schemas and partitionings pyiceberg refuses, and
messages too long for a gRPC trailer: each is refused up front with a message
that names the field and quotes at most about 200 characters of the input,
never answered UNAVAILABLE (which clients retry forever), UNKNOWN or with a
transport error. One coordinator serves the whole module: every case is a
refusal, so the metastore and the catalog stay as the first registration left them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy import text

from coordinator_service.contract.client import CoordinatorClient, TableSpec
from coordinator_service.contract.errors import MESSAGE_BYTES, InvalidArgument
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc.sink_coordinator_pb2_grpc import SinkCoordinatorStub
from coordinator_service.contract.views import Registration, SinkState
from coordinator_service.grpc_server import build_server
from coordinator_service.log.database import normalize_url
from coordinator_service.runtime import migrate
from coordinator_service.tables.catalog_calls import in_catalog
from tests.fixtures.admin import AdminApp
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, write_parquet
from tests.fixtures.postgres import new_database
from tests.fixtures.refusals import refused

SCHEMA = ORDERS.serialize().to_pybytes()
INVALID = grpc.StatusCode.INVALID_ARGUMENT
# A run of one character longer than any error message may quote.
LONG = 100_000


@dataclass
class Service:
    coordinator: CoordinatorProcess
    database_url: str
    client: CoordinatorClient
    writer: Registration

    def refused(self, call: Callable[[], object], *fragments: str) -> str:
        """The call is INVALID_ARGUMENT naming the fragments, and the metastore and catalog are unchanged."""
        return refused(self.database_url, call, INVALID, *fragments).message


@pytest.fixture(scope="module")
def service(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with new_database(postgres_url) as database_url:
        migrate(normalize_url(database_url))
        process = CoordinatorProcess(database_url, tmp_path_factory.mktemp("client-input")).start()
        try:
            with process.client(retry_seconds=0) as client:
                writer = client.register_writer("orders", "shop.orders", -1, arrow_schema=SCHEMA)
                yield Service(process, database_url, client, writer)
        finally:
            process.stop()


def new_sink() -> str:
    """A sink name of its own per case, so that a case accepted by mistake cannot make the next one fail."""
    return f"case-{uuid.uuid4().hex[:12]}"


def schema_of(*fields: pa.Field) -> bytes:
    return pa.schema(list(fields)).serialize().to_pybytes()


@pytest.mark.parametrize(
    ("table", "fragments"),
    [
        ("shop.or\x00ders", ("table identifier", "control character")),
        ("sh\x00op.orders", ("table identifier", "control character")),
        ("shop.line\nbreak", ("table identifier", "control character")),
        ("n" * 256 + ".orders", ("namespace is 256 bytes", "at most 255")),
        ("shop." + "t" * 256, ("table name is 256 bytes", "at most 255")),
        ("shop." + "é" * 128, ("the character 'é'",)),
        ("lake.shop.orders", ("nested namespace", "'namespace.table'")),
        ("shop.orders/data", ("path separator '/'",)),
        ("shop.Orders", ("upper-case 'O'", "lower case")),
        ("shop..orders", ("no empty part",)),
    ],
    ids=[
        "nul-in-table",
        "nul-in-namespace",
        "newline",
        "long-namespace",
        "long-table",
        "non-ascii",
        "nested",
        "inside-another",
        "upper-case",
        "empty-part",
    ],
)
def test_table_identifiers_the_catalog_cannot_store(service: Service, table: str, fragments: tuple[str, ...]) -> None:
    service.refused(lambda: service.client.register_writer(new_sink(), table, -1, arrow_schema=SCHEMA), *fragments)


@pytest.mark.parametrize("table", ["shop.orders/data", "shop.Orders"])
def test_a_route_table_outside_the_name_policy_is_refused(service: Service, table: str) -> None:
    specs = [TableSpec(table, SCHEMA, ())]
    term = service.writer.writer_term
    service.refused(lambda: service.client.ensure_tables("orders", term, specs), "table identifier")


def test_a_sink_name_with_a_trailing_line_break_is_refused(service: Service) -> None:
    service.refused(lambda: service.client.register_writer("orders\n", "shop.orders", -1), "sink name")


def test_the_registration_says_whether_the_catalog_has_nested_namespaces(service: Service) -> None:
    assert service.writer.nested_namespaces is False  # the SQL catalog has none


def test_names_of_the_longest_storable_size_are_taken(service: Service) -> None:
    """The limits are the catalog's: 255 bytes of namespace and of table name work."""
    registered = service.client.register_writer("longest", "n" * 255 + "." + "t" * 255, -1, arrow_schema=SCHEMA)
    assert registered.writer_term == 1


@pytest.mark.parametrize(
    ("table", "schema", "partition_by", "fragments"),
    [
        ("shop.nul_column", schema_of(pa.field("a\x00b", pa.int64())), (), ("arrow_schema", "'a\\x00b'", "NUL")),
        (
            "shop.nul_nested",
            schema_of(pa.field("s", pa.struct([pa.field("in\x00ner", pa.int64())]))),
            (),
            ("arrow_schema", "NUL"),
        ),
        ("shop.null_type", schema_of(pa.field("n", pa.null())), (), ("cannot be created", "Null type")),
        (
            "shop.duplicate",
            schema_of(pa.field("a", pa.int64()), pa.field("a", pa.int64())),
            (),
            ("cannot be created", "multiple fields for name a"),
        ),
        ("new_namespace.by_day", SCHEMA, ("day(customer)",), ("cannot be created", "day cannot transform string")),
        (
            "shop.redundant",
            schema_of(pa.field("ts", pa.timestamp("us"))),
            ("day(ts)", "hour(ts)"),
            ("cannot be created", "conflicts with ts_day"),
        ),
        ("shop.wide", SCHEMA, ("truncate(2147483648, customer)",), ("partition field", "2147483647")),
        ("shop.zero", SCHEMA, ("truncate(0, customer)",), ("partition field", "2147483647")),
    ],
    ids=["nul-column", "nul-nested-column", "null-type", "duplicate-column", "transform", "redundant", "width", "zero"],
)
def test_new_tables_pyiceberg_refuses(
    service: Service, table: str, schema: bytes, partition_by: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    """Refused before the namespace or the table is created (the catalog rows are compared)."""
    service.refused(
        lambda: service.client.register_writer(
            new_sink(), table, -1, arrow_schema=schema, partition_by=list(partition_by)
        ),
        *fragments,
    )


def test_columns_pyiceberg_cannot_add(service: Service) -> None:
    with_null = ORDERS.append(pa.field("nothing", pa.null()))
    service.refused(
        lambda: service.client.register_writer(
            "orders", "shop.orders", -1, arrow_schema=with_null.serialize().to_pybytes()
        ),
        "cannot add",
        "nothing",
    )
    path = write_parquet(
        service.writer.table_location, [{"order_id": 1, "customer": "c", "amount": 1.0, "nothing": None}], with_null
    )
    service.refused(
        lambda: service.client.pre_commit("orders", 0, service.writer.writer_term, [path], evolve_schema=True),
        "cannot add",
        "nothing",
    )


def assert_quotes_little(message: str, run: str) -> None:
    assert len(message) < 1000, message
    assert run * 201 not in message, f"the message quotes more than 200 characters of the input: {message[:300]}"


def test_long_input_is_quoted_short(service: Service) -> None:
    """Before, the whole input went into the status message: past 8 KiB the client got RESOURCE_EXHAUSTED."""
    client, term, location = service.client, service.writer.writer_term, service.writer.table_location
    cases: list[tuple[Callable[[], object], str, str]] = [
        (lambda: client.register_writer("x" * LONG, "shop.orders", -1), "x", "sink name"),
        (lambda: client.sink_state("y" * LONG), "y", "sink name"),
        (
            lambda: client.register_writer(new_sink(), "shop.orders", -1, partition_by=["day(" + "p" * LONG]),
            "p",
            "partition field",
        ),
        (lambda: client.register_writer(new_sink(), "shop." + "q" * LONG, -1), "q", "table name is"),
        (lambda: client.pre_commit("orders", 0, term, [f"{location}/data/{'f' * LONG}.parquet"]), "f", "data file"),
        (lambda: client.pre_commit("orders", 0, term, ["r" * LONG]), "r", "relative"),
    ]
    for call, run, fragment in cases:
        assert_quotes_little(service.refused(call, fragment), run)


def test_nul_in_a_data_file_path(service: Service) -> None:
    location = service.writer.table_location
    message = service.refused(
        lambda: service.client.pre_commit("orders", 0, service.writer.writer_term, [f"{location}/data/a\x00.parquet"]),
        "data file path",
        "NUL",
    )
    assert message.count("a\\x00.parquet") == 1, message


def test_a_long_schema_mismatch_fits_in_the_answer(service: Service) -> None:
    """pyiceberg explains a misfit with a table of every column; for a wide table that outgrew a gRPC trailer."""
    columns = [pa.field(f"column_with_a_long_name_{i:03d}", pa.int64()) for i in range(200)]
    client = service.client
    wide = client.register_writer("wide", "shop.wide_table", -1, arrow_schema=schema_of(*columns))
    misfit = pa.schema([*columns[:-1], pa.field(columns[-1].name, pa.string())])
    path = write_parquet(wide.table_location, [{field.name: None for field in misfit}], misfit)
    message = service.refused(lambda: client.pre_commit("wide", 0, wide.writer_term, [path]), "does not fit")
    assert len(message.encode()) <= MESSAGE_BYTES


def test_a_malformed_request_is_invalid_argument(service: Service) -> None:
    """Bytes that are not the request message (or a string that is not UTF-8) never reach the protocol."""
    with grpc.insecure_channel(service.coordinator.target) as channel:
        call = channel.unary_unary("/sinkcoord.v1.SinkCoordinator/GetSinkState")
        for raw, fragment in (
            (pb.GetSinkStateRequest(sink="orders").SerializeToString()[:-1] + b"\xff", "GetSinkStateRequest"),
            (b"\x0a\x03\xed\xa0\x80", "UTF-8"),  # field 1 (sink) holding an encoded surrogate
        ):
            with pytest.raises(grpc.RpcError) as raised:
                call(raw, timeout=10)
            assert raised.value.code() == INVALID, raised.value
            assert fragment in str(raised.value.details()), raised.value.details()


def test_a_checkpoint_at_the_int64_limit_is_answered(
    coordinator_factory: Callable[..., CoordinatorProcess], database_url: str
) -> None:
    """Before, the coordinator listed every epoch up to the checkpoint (2**63 of them) on its event loop, and hung."""
    coordinator = coordinator_factory()
    top = 2**63 - 1
    with coordinator.client(retry_seconds=0, timeout_seconds=10) as client:
        writer = client.register_writer("orders", "shop.orders", -1, arrow_schema=SCHEMA)
        client.pre_commit("orders", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 3))])
        failed = grpc.StatusCode.FAILED_PRECONDITION
        message = refused(
            database_url, lambda: client.commit_checkpoint("orders", top, writer.writer_term), failed, "(1, 2, 3"
        ).message
        assert "(1, 2, 3, 4, 5, 6, 7, 8, 9, 10 ...)" in message
        refused(database_url, lambda: client.register_writer("orders", "shop.orders", top), failed, "(1, 2, 3")
        assert client.sink_state("orders").checkpointed_epoch == -1


async def test_a_value_the_catalog_database_refuses_is_invalid_argument(database_url: str, tmp_path: Path) -> None:
    """The last net: a psycopg DataError out of the catalog is the request's fault, not an outage to retry."""
    catalog = SqlCatalog("default", uri=database_url, warehouse=tmp_path.as_uri())
    with pytest.raises(InvalidArgument, match="cannot be stored"):
        await in_catalog(catalog.load_table, ("sh\x00op", "orders"))


async def test_a_value_postgresql_refuses_is_invalid_argument_not_unknown(
    admin: AdminApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last net: a psycopg DataError that reaches the gRPC adapter unchecked is still the request's fault."""
    runtime = admin.runtime

    async def refused_by_postgresql(sink: str) -> SinkState:
        async with runtime.database.transaction() as session:
            await session.execute(text("SELECT CAST(:value AS text)"), {"value": sink})
        raise AssertionError("PostgreSQL stored a NUL byte")

    monkeypatch.setattr(runtime.coordinator, "sink_state", refused_by_postgresql)
    server, _, port = build_server(runtime.coordinator, "127.0.0.1:0", runtime.settings)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await SinkCoordinatorStub(channel).GetSinkState(pb.GetSinkStateRequest(sink="nul \x00 byte"))
    finally:
        await server.stop(None)
    assert raised.value.code() == INVALID, raised.value
    assert raised.value.details() == (
        "the request holds a value that cannot be stored: PostgreSQL text fields cannot contain NUL (0x00) bytes"
    )
