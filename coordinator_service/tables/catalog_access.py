"""How to read the coordinator's tables from elsewhere: the lines to paste into pyiceberg, DuckDB and Spark.

`sink-coordinator catalog [TABLE]` prints them, and the demo's "where things are" shows them for its table. They
come from the catalog properties the coordinator itself uses (coordinator_service.runtime.catalog_properties):
pyiceberg takes them as they are; Spark's Iceberg catalog takes the same keys, except that pyiceberg's SQL catalog
is Iceberg's JDBC catalog there (the same tables in the same database); DuckDB's iceberg extension reads a table
from its metadata file (or attaches a REST catalog). Secrets (a password in a URI, credentials, tokens) are
hidden unless asked for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sqlalchemy.engine import make_url

# Catalog property names whose values are secrets (pyiceberg's and Iceberg's: credential, token, s3.secret-access-key,
# s3.session-token, client secrets, passwords).
_SECRET_KEY: Final = re.compile(r"credential|token|secret|password", re.IGNORECASE)
HIDDEN: Final = "<hidden: --show-secrets>"


@dataclass(frozen=True)
class CatalogAccess:
    """A catalog as the coordinator opens it (its pyiceberg name and properties), and optionally one table's current
    metadata file."""

    name: str
    properties: Mapping[str, str]
    table: str | None = None
    metadata_location: str | None = None

    def shown(self, show_secrets: bool) -> dict[str, str]:
        """The properties, their secrets hidden unless `show_secrets`."""
        if show_secrets:
            return dict(self.properties)
        return {key: _hidden(key, value) for key, value in self.properties.items()}

    def pyiceberg(self, show_secrets: bool) -> list[str]:
        lines = [
            "from pyiceberg.catalog import load_catalog",
            f"catalog = load_catalog({self.name!r}, **{json.dumps(self.shown(show_secrets))})",
        ]
        if self.table is not None:
            lines.append(f"print(catalog.load_table({self.table!r}).scan().to_arrow())")
        return lines

    def duckdb(self, show_secrets: bool) -> list[str]:
        properties = self.shown(show_secrets)
        if properties.get("type") == "rest":
            lines = ["INSTALL iceberg; LOAD iceberg;"]
            if "token" in properties:
                lines.append(f"CREATE SECRET ({{'TYPE': 'iceberg', 'TOKEN': '{properties['token']}'}});")
            warehouse = properties.get("warehouse", "")
            lines.append(f"ATTACH '{warehouse}' AS {self.name} (TYPE iceberg, ENDPOINT '{properties.get('uri', '')}');")
            if self.table is not None:
                lines.append(f"SELECT count(*) FROM {self.name}.{self.table};")
            return lines
        if self.metadata_location is None:
            return ["-- the iceberg extension reads a table's metadata file: `sink-coordinator catalog TABLE` names it"]
        location = self.metadata_location.removeprefix("file://")
        return ["INSTALL iceberg; LOAD iceberg;", f"SELECT count(*) FROM iceberg_scan('{location}');"]

    def spark(self, show_secrets: bool) -> list[str]:
        prefix = f"spark.sql.catalog.{self.name}"
        properties = self.shown(show_secrets)
        settings = {prefix: "org.apache.iceberg.spark.SparkCatalog"}
        if properties.get("type", "") == "sql":
            settings.update(_jdbc(prefix, self.properties, show_secrets))
        else:
            settings.update({f"{prefix}.{key}": value for key, value in properties.items()})
        lines = [f"--conf {key}={value}" for key, value in settings.items()]
        if self.table is not None:
            lines.append(f"spark.table('{self.name}.{self.table}').show()")
        return lines

    def text(self, show_secrets: bool) -> str:
        """Every section, for a terminal."""
        kind = self.properties.get("type", "from its uri")
        hidden = "" if show_secrets or self.shown(False) == dict(self.properties) else " (secrets hidden)"
        return "\n".join(
            [
                f"catalog {self.name!r} ({kind}){hidden}",
                "",
                "pyiceberg:",
                *(f"  {line}" for line in self.pyiceberg(show_secrets)),
                "",
                "DuckDB (its iceberg extension):",
                *(f"  {line}" for line in self.duckdb(show_secrets)),
                "",
                "Spark (with the iceberg-spark-runtime jar, and PostgreSQL's JDBC driver for a SQL catalog):",
                *(f"  {line}" for line in self.spark(show_secrets)),
            ]
        )


def _hidden(key: str, value: str) -> str:
    if _SECRET_KEY.search(key):
        return HIDDEN
    if key == "uri" and "://" in value:
        try:
            url = make_url(value)
        except Exception:  # not a database URL (a REST endpoint): nothing of it is a password
            return value
        if url.password is not None:
            return url.set(password=HIDDEN).render_as_string(hide_password=False)
    return value


def _jdbc(prefix: str, properties: Mapping[str, str], show_secrets: bool) -> dict[str, str]:
    """pyiceberg's SQL catalog as Iceberg's JDBC catalog: the same iceberg_tables in the same database (schema V0)."""
    url = make_url(properties["uri"]) if "uri" in properties else None
    settings = {f"{prefix}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog"}
    if url is not None:
        port = f":{url.port}" if url.port else ""
        settings[f"{prefix}.uri"] = f"jdbc:postgresql://{url.host or 'localhost'}{port}/{url.database or ''}"
        if url.username:
            settings[f"{prefix}.jdbc.user"] = url.username
        if url.password is not None:
            settings[f"{prefix}.jdbc.password"] = url.password if show_secrets else HIDDEN
    settings[f"{prefix}.jdbc.schema-version"] = "V0"
    for key, value in properties.items():
        if key not in ("type", "uri"):
            settings[f"{prefix}.{key}"] = value if show_secrets else _hidden(key, value)
    return settings
