"""The lines `sink-coordinator catalog` prints: the catalog's properties for pyiceberg, Iceberg's names for Spark,
DuckDB's way in, and no secret unless asked (coordinator_service.tables.catalog_access)."""

from __future__ import annotations

from coordinator_service.tables.catalog_access import HIDDEN, CatalogAccess

SQL = CatalogAccess(
    "lake",
    {
        "type": "sql",
        "uri": "postgresql+psycopg://iceberg:s3cr3t-pw@pg.example:5433/catalog",
        "warehouse": "s3://lake/warehouse",
        "s3.secret-access-key": "AKIA-secret-key",
        "s3.access-key-id": "AKIA-id",
    },
    "shop.orders",
    "s3://lake/warehouse/shop/orders/metadata/00001-x.metadata.json",
)
REST = CatalogAccess(
    "polaris",
    {"type": "rest", "uri": "https://polaris.example/api/catalog", "warehouse": "lake", "token": "t0ken-value"},
    "shop.orders",
)


def test_secrets_are_hidden_unless_asked_for() -> None:
    for access, secrets in ((SQL, ("s3cr3t-pw", "AKIA-secret-key")), (REST, ("t0ken-value",))):
        hidden = access.text(show_secrets=False)
        assert "(secrets hidden)" in hidden and HIDDEN in hidden
        assert not [secret for secret in secrets if secret in hidden]
        shown = access.text(show_secrets=True)
        assert all(secret in shown for secret in secrets) and HIDDEN not in shown
    assert "https://polaris.example/api/catalog" in REST.text(show_secrets=False)  # a URL, not a password
    assert "AKIA-id" in SQL.text(show_secrets=False)


def test_a_sql_catalog_is_icebergs_jdbc_catalog_for_spark() -> None:
    lines = SQL.spark(show_secrets=True)
    assert lines[:6] == [
        "--conf spark.sql.catalog.lake=org.apache.iceberg.spark.SparkCatalog",
        "--conf spark.sql.catalog.lake.catalog-impl=org.apache.iceberg.jdbc.JdbcCatalog",
        "--conf spark.sql.catalog.lake.uri=jdbc:postgresql://pg.example:5433/catalog",
        "--conf spark.sql.catalog.lake.jdbc.user=iceberg",
        "--conf spark.sql.catalog.lake.jdbc.password=s3cr3t-pw",
        "--conf spark.sql.catalog.lake.jdbc.schema-version=V0",
    ]
    assert "--conf spark.sql.catalog.lake.warehouse=s3://lake/warehouse" in lines
    assert lines[-1] == "spark.table('lake.shop.orders').show()"
    assert "--conf spark.sql.catalog.polaris.type=rest" in REST.spark(show_secrets=False)


def test_duckdb_scans_a_tables_metadata_or_attaches_a_rest_catalog() -> None:
    assert SQL.duckdb(show_secrets=False)[-1] == (
        "SELECT count(*) FROM iceberg_scan('s3://lake/warehouse/shop/orders/metadata/00001-x.metadata.json');"
    )
    assert "ATTACH 'lake' AS polaris (TYPE iceberg, ENDPOINT 'https://polaris.example/api/catalog');" in REST.duckdb(
        show_secrets=False
    )
    assert CatalogAccess("lake", {"type": "glue"}).duckdb(show_secrets=False)[0].startswith("-- ")
