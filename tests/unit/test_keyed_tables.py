"""Keyed tables (coordinator_service.tables.keyed_tables) as the gateway creates and checks them: format v2, the key
columns as required identifier fields, refused keys refused before anything exists."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.key_resolution import key_columns
from tests.fixtures.keyed_tables import KEYED

COMPOSITE = pa.schema(
    [
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("id", pa.int64(), nullable=False),
        pa.field("value", pa.string()),
    ]
)


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return SqlCatalog("test", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "warehouse").as_uri())


@pytest.fixture
def gateway(catalog: Catalog) -> IcebergGateway:
    return IcebergGateway(catalog)


def test_a_keyed_table_is_created_as_format_v2_with_its_key_as_required_identifier_fields(
    gateway: IcebergGateway, catalog: Catalog
) -> None:
    gateway.ensure_table("db.accounts", COMPOSITE, ("tenant",), key=("id", "tenant"))

    table = catalog.load_table("db.accounts")
    schema = table.schema()
    assert table.format_version == 2
    assert key_columns(schema) == ("id", "tenant")
    assert [schema.find_field(name).required for name in ("tenant", "id", "value")] == [True, True, False]
    assert [str(field.transform) for field in table.spec().fields] == ["identity"]
    # Registering again with the same key takes the table as it is.
    gateway.ensure_table("db.accounts", COMPOSITE, ("tenant",), key=("id", "tenant"))
    assert catalog.load_table("db.accounts").metadata_location == table.metadata_location


@pytest.mark.parametrize(
    ("schema", "key", "refusal"),
    [
        (KEYED, ("order_id",), "key columns 'order_id' are not in arrow_schema"),
        (KEYED, ("id", "id"), "names a column twice"),
        (KEYED, ("value",), "key columns 'value' may hold nulls in arrow_schema"),
        (pa.schema([pa.field("score", pa.float64(), nullable=False)]), ("score",), "must not be float or double"),
        (
            pa.schema([pa.field("tags", pa.list_(pa.string()), nullable=False)]),
            ("tags",),
            "not a primitive type",
        ),
    ],
)
def test_a_key_iceberg_would_refuse_is_refused_before_anything_exists(
    gateway: IcebergGateway, catalog: Catalog, schema: pa.Schema, key: tuple[str, ...], refusal: str
) -> None:
    with pytest.raises(InvalidArgument, match=refusal):
        gateway.ensure_table("db.accounts", schema, (), key=key)
    assert catalog.list_namespaces() == []


def test_a_present_table_is_taken_as_keyed_only_with_that_key_and_format_v2(
    gateway: IcebergGateway, catalog: Catalog
) -> None:
    gateway.ensure_table("db.plain", KEYED, ())
    gateway.ensure_table("db.keyed", COMPOSITE, (), key=("tenant", "id"))
    catalog.create_table("db.v1", schema=KEYED, properties={"format-version": "1"})

    with pytest.raises(InvalidArgument, match=r"'db.plain' cannot take rows keyed by 'id': it has no key"):
        gateway.ensure_table("db.plain", KEYED, (), key=("id",))
    with pytest.raises(InvalidArgument, match=r"'db.keyed' cannot take rows keyed by 'id, tenant': its key is "):
        gateway.ensure_table("db.keyed", COMPOSITE, (), key=("id", "tenant"))
    with pytest.raises(InvalidArgument, match=r"'db.v1' is format v1: an upsert or change stream needs format v2"):
        gateway.ensure_table("db.v1", KEYED, (), key=("id",))
