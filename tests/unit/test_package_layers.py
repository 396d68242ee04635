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


def imported(source: Path) -> set[str]:
    """The coordinator_service modules `source` imports, as dotted names below coordinator_service."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "coordinator_service":
                names.update(alias.name for alias in node.names)
            elif node.module.startswith("coordinator_service."):
                names.add(node.module.removeprefix("coordinator_service."))
        elif isinstance(node, ast.Import):
            names.update(
                alias.name.removeprefix("coordinator_service.")
                for alias in node.names
                if alias.name.startswith("coordinator_service.")
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
        for name in imported(PACKAGE / f"{shared}.py")
        if name.split(".")[0] in LAYERS and LAYERS.index(name.split(".")[0]) > lowest
    }
    assert not wrong, sorted(wrong)


def test_every_module_is_in_a_layer_or_the_process() -> None:
    """The top of the package holds the process (settings, wiring, serving, the command line): nothing else."""
    top = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    process = {"app", "cli", "runtime", "startup", "grpc_server", "grpc_gate", "grpc_requests", "listening"}
    process |= SHARED - {"__version__"}
    assert top == process
    assert {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()} == set(LAYERS)
