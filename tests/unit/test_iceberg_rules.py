import pyarrow as pa
import pytest
from pyiceberg.transforms import DayTransform, IdentityTransform, TruncateTransform

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.table_identifiers import parse_table_identifier
from coordinator_service.tables.file_paths import canonical_uri, check_inside_location
from coordinator_service.tables.schema_fit import decode_arrow_schema
from coordinator_service.tables.table_creation import parse_partition_field


@pytest.mark.parametrize(
    ("path", "uri"),
    [
        ("/w/t/data/a.parquet", "file:///w/t/data/a.parquet"),
        ("file:///w/t/data/a.parquet", "file:///w/t/data/a.parquet"),
        ("file:///w/t//data/./a.parquet", "file:///w/t/data/a.parquet"),
        ("s3://bucket/w/t/data/a.parquet", "s3://bucket/w/t/data/a.parquet"),
    ],
)
def test_canonical_uri(path: str, uri: str) -> None:
    assert canonical_uri(path) == uri


@pytest.mark.parametrize(
    ("path", "message"),
    [("", "empty"), ("data/a.parquet", "relative"), ("/w/t/../x.parquet", "'..'")],
)
def test_canonical_uri_refuses(path: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        canonical_uri(path)


def test_inside_location() -> None:
    check_inside_location("file:///w/t/data/a.parquet", "file:///w/t")
    check_inside_location("s3://b/w/t/data/a.parquet", "s3://b/w/t/")
    for outside in ("file:///w/tt/a.parquet", "file:///w/a.parquet", "s3://b/w/t/a.parquet", "s3://other/w/t/a"):
        with pytest.raises(InvalidArgument, match="outside the table location"):
            check_inside_location(outside, "file:///w/t" if outside.startswith("file") else "s3://b/w/t/data")


@pytest.mark.parametrize(
    ("text", "source", "transform"),
    [
        ("region", "region", IdentityTransform()),
        ("identity(region)", "region", IdentityTransform()),
        ("day(ts)", "ts", DayTransform()),
        (" truncate( 4 , name ) ", "name", TruncateTransform(4)),
    ],
)
def test_partition_fields(text: str, source: str, transform: object) -> None:
    assert parse_partition_field(text) == (source, transform)


@pytest.mark.parametrize("text", ["week(ts)", "bucket(id)", "day(3, ts)", "a b", ""])
def test_bad_partition_fields(text: str) -> None:
    with pytest.raises(InvalidArgument, match="partition field"):
        parse_partition_field(text)


def test_bucket_partitioning_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidArgument, match="bucket partitioning is not supported"):
        parse_partition_field("bucket(16, id)")


def test_table_identifiers() -> None:
    assert parse_table_identifier("db.orders") == ("db", "orders")
    assert parse_table_identifier("a.b.orders") == ("a", "b", "orders")
    for bad in ("orders", "db.", ".orders", "db. orders"):
        with pytest.raises(InvalidArgument, match=r"namespace\.table"):
            parse_table_identifier(bad)


def test_arrow_schema_decoding() -> None:
    schema = pa.schema([("id", pa.int64())])
    assert decode_arrow_schema(schema.serialize().to_pybytes()) == schema
    with pytest.raises(InvalidArgument, match="Arrow IPC"):
        decode_arrow_schema(b"nonsense")
