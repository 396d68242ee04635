"""Where the tables' files live, as far as the coordinator's settings say: a warehouse on this machine's file system
(the default SQL catalog's DATA_DIR/warehouse, or a configured `file:` or absolute-path warehouse), or elsewhere.

A warehouse on this machine serves writers on this machine only: Spark executors elsewhere cannot write their
data files there, and the tables' metadata goes with the machine (a pod's scratch disk goes with the pod while
the metastore still names the tables). So `serve` refuses it where the coordinator listens beyond loopback,
unless ALLOW_LOCAL_WAREHOUSE says every writer shares the file system; and readiness checks that it is there
and writable. Where the catalog keeps files elsewhere (object stores, a REST catalog's own warehouse) the
catalog and its storage answer for them.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from coordinator_service.settings import Settings
from coordinator_service.settings.bounds import ENV_PREFIX


def local_warehouse(settings: Settings) -> Path | None:
    """The warehouse directory on this machine's file system, or None when the catalog keeps files elsewhere
    (or decides where: a REST catalog's warehouse is a name)."""
    if not settings.catalog:
        return settings.warehouse_dir.expanduser().resolve()
    warehouse = settings.catalog.get("warehouse", "")
    parsed = urlparse(warehouse)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if not parsed.scheme and warehouse.startswith("/"):
        return Path(warehouse)
    return None


def listens_beyond_loopback(bind_host: str) -> bool:
    """Whether other machines may reach the ports: any address but a loopback one (a host name other than
    localhost counts as reachable, whatever it resolves to)."""
    if bind_host.lower() == "localhost":
        return False
    try:
        return not ipaddress.ip_address(bind_host.strip("[]")).is_loopback
    except ValueError:
        return True


def serving_refusal(settings: Settings) -> str | None:
    """Why `serve` must not start with these settings (a local warehouse for writers elsewhere), or None."""
    warehouse = local_warehouse(settings)
    if warehouse is None or settings.allow_local_warehouse or not listens_beyond_loopback(settings.bind_host):
        return None
    where = (
        "no catalog is configured, so the tables would go to a SQL catalog with its warehouse in DATA_DIR/warehouse"
        if not settings.catalog
        else "the catalog's warehouse is on this machine's file system"
    )
    return (
        f"{where} ({warehouse}), but the coordinator listens on {settings.bind_host}, for writers on other "
        "machines: their executors cannot write there, and the tables' metadata goes with this machine. Configure "
        f"a catalog whose warehouse every writer reaches ({ENV_PREFIX}CATALOG__TYPE, {ENV_PREFIX}CATALOG__URI, "
        f"{ENV_PREFIX}CATALOG__WAREHOUSE=s3://...), or set {ENV_PREFIX}ALLOW_LOCAL_WAREHOUSE=true if every writer "
        "shares this file system"
    )


def writability(directory: Path) -> str:
    """'ok' when the directory is there and this process may create files in it, else what is wrong (no file is
    written: a read-only file system or missing permissions is what access(2) reports)."""
    if not directory.is_dir():
        return (
            f"missing: {directory} is not a directory (the tables kept there, their metadata and files, are gone "
            "if it was)"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"not writable: this process cannot create files in {directory} (read-only, or its permissions)"
    return "ok"
