"""The coordinator's packages are layers: each imports only the layers below it (and the process's modules they
share: settings, metrics, failpoints, writer_scopes), so the log never reaches into the engine and the contract the
writer installs never reaches into the server. Read from the source (every import, TYPE_CHECKING ones and those
inside functions included), so a new module is covered without a new test."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import pytest

PACKAGE: Final = Path(__file__).parents[2] / "coordinator_service"
# Lowest first: a package imports only the ones before it.
LAYERS: Final = ("contract", "log", "tables", "engine", "admin")
# The process's modules every layer may use (they import no layer above the one using them: checked below), and the
# package's version.
SHARED: Final = frozenset({"settings", "metrics", "failpoints", "writer_scopes", "__version__"})
# The admin API serves the process's wiring (its routes take the Runtime).
ADAPTER_EXTRA: Final = {"admin": frozenset({"runtime"})}


def imported(source: Path, package: str = "coordinator_service") -> set[str]:
    """The modules of `package` that `source` imports, as dotted names below the package."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == package:
                names.update(alias.name for alias in node.names)
            elif node.module.startswith(f"{package}."):
                names.add(node.module.removeprefix(f"{package}."))
        elif isinstance(node, ast.Import):
            names.update(
                alias.name.removeprefix(f"{package}.") for alias in node.names if alias.name.startswith(f"{package}.")
            )
    return names


def modules_of(layer: str) -> list[Path]:
    return sorted(path for path in (PACKAGE / layer).rglob("*.py") if "rpc" not in path.relative_to(PACKAGE).parts)


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    # The writer installs contract/ alone: it shares nothing with the process.
    shared = set() if layer == "contract" else SHARED | ADAPTER_EXTRA.get(layer, frozenset())
    wrong = {
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in modules_of(layer)
        for name in imported(path)
        if name.split(".")[0] not in allowed | shared
    }
    assert not wrong, sorted(wrong)


def test_the_shared_modules_import_no_layer_above_their_users() -> None:
    """settings, metrics, failpoints and writer_scopes are used from the lowest layer that uses them: they may import
    that layer's modules and those below it, never one above (an import cycle in waiting)."""
    users = {
        shared: min(
            (LAYERS.index(layer) for layer in LAYERS for path in modules_of(layer) if shared in imported(path)),
            default=len(LAYERS),
        )
        for shared in SHARED - {"__version__"}
    }
    wrong = {
        f"{shared}.py imports {name}"
        for shared, lowest in users.items()
        for source in sources_of(shared)
        for name in imported(source)
        if name.split(".")[0] in LAYERS and LAYERS.index(name.split(".")[0]) > lowest
    }
    assert not wrong, sorted(wrong)


def sources_of(shared: str) -> list[Path]:
    """A shared module's source, or every module of a shared package (settings)."""
    package = PACKAGE / shared
    return sorted(package.rglob("*.py")) if package.is_dir() else [PACKAGE / f"{shared}.py"]


def test_every_module_is_in_a_layer_or_the_process() -> None:
    """The top of the package holds the process (settings, wiring, serving, the command line): nothing else."""
    packages = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    top = ({path.stem for path in PACKAGE.glob("*.py")} | packages) - {"__init__"} - set(LAYERS)
    process = {
        "app",
        "cli",
        "runtime",
        "startup",
        "supervisor",
        "grpc_server",
        "grpc_gate",
        "grpc_requests",
        "listening",
    }
    process |= SHARED - {"__version__"}
    assert top == process
    assert set(LAYERS) <= packages


def third_party(source: Path) -> set[str]:
    """The top-level names of the packages outside coordinator_service that `source` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return names - {"coordinator_service"}


def test_only_the_tables_layer_speaks_the_table_format() -> None:
    """The table format is one layer's business: the engine decides (what to commit, delete, keep) on tables/'s
    answers and types (LoadedTable, PERMANENT_FAILURES, in_catalog's CatalogConflict), and never names pyiceberg;
    a change of pyiceberg's API, or of the format library, stays in tables/."""
    wrong = sorted(
        str(path.relative_to(PACKAGE))
        for layer in LAYERS
        if layer != "tables"
        for path in modules_of(layer)
        if "pyiceberg" in third_party(path)
    )
    assert not wrong


WRITER: Final = Path(__file__).parents[2] / "spark_writer"
# The writer's packages, lowest first: the Kafka source, the formats, the routes, the sink, the row mutations (the job
# and the process's helpers sit at the top of the package).
WRITER_LAYERS: Final = ("kafka", "formats", "routing", "sink", "mutations")


@pytest.mark.parametrize("layer", WRITER_LAYERS)
def test_a_writer_layer_imports_only_the_layers_below_it_and_the_shared_helpers(layer: str) -> None:
    """The sink uses the formats and the source; the formats know nothing of the sink or of Kafka's offsets; the
    routes are pure. A module at the top of the package a layer uses (arrow_schema, spark_errors, ...) imports
    no layer at all."""
    allowed = set(WRITER_LAYERS[: WRITER_LAYERS.index(layer) + 1])
    wrong = set()
    for path in sorted((WRITER / layer).rglob("*.py")):
        for name in imported(path, "spark_writer"):
            first = name.split(".")[0]
            if first in WRITER_LAYERS and first not in allowed:
                wrong.add(f"{path.relative_to(WRITER)} imports {name}")
            elif first not in WRITER_LAYERS and {
                n.split(".")[0] for n in imported(WRITER / f"{first}.py", "spark_writer")
            } & set(WRITER_LAYERS):
                wrong.add(f"{path.relative_to(WRITER)} imports {name}, which imports a layer")
    assert not wrong, sorted(wrong)


# What a pyiceberg table (and its metadata, storage and catalog) offers, and no type of the engine's own has.
TABLE_INTERNALS: Final = frozenset({"io", "current_snapshot", "location_provider", "inspect", "scan"})
METADATA_INTERNALS: Final = frozenset(
    {"snapshots", "refs", "properties", "schemas", "partition_specs", "name_mapping", "table_uuid", "default_spec_id"}
)


def reaches_into_a_table(node: ast.AST) -> bool:
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr in TABLE_INTERNALS:
        return True
    inner = node.value
    if node.attr in METADATA_INTERNALS and isinstance(inner, ast.Attribute) and inner.attr == "metadata":
        return True
    return node.attr == "catalog" and isinstance(inner, ast.Attribute) and inner.attr == "iceberg"


def test_the_engine_holds_tables_only_as_handles_of_the_table_format() -> None:
    """The engine reads a table only through coordinator_service.tables (TableFormat, table_maintenance), which
    answers in neutral types: it never reads a LoadedTable's metadata, its storage or the catalog behind it, so that
    another table format (or a row delta) changes tables/ alone."""
    wrong = sorted(
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in modules_of("engine")
        for node in ast.walk(ast.parse(path.read_text()))
        if reaches_into_a_table(node)
    )
    assert not wrong
