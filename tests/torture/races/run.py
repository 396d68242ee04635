"""One race of a kind with a seed: open the system, let the kind act, settle, check."""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

from coordinator_service import failpoints
from tests.torture.races.harness import open_run


async def race(kind: str, seed: int, postgres_url: str, root: Path) -> dict[str, Any]:
    module = importlib.import_module(f"tests.torture.races.{kind}")
    started = time.monotonic()
    run, close = await open_run(seed, postgres_url, root, **module.SETTINGS)
    try:
        await module.act(run)
        await run.settle()
        await run.check()
    except Exception as error:  # an actor or a check that raises is an anomaly of the run, with its seed
        run.anomalies.append(f"{type(error).__name__}: {error}")
    finally:
        failpoints.configure("")
        await close()
    return {
        "kind": kind,
        "seed": seed,
        "seconds": round(time.monotonic() - started, 2),
        "epochs": len(run.epochs),
        "facts": dict(run.facts),
        "anomalies": run.anomalies,
        "replay": f"python -m tests.torture.races --runs 1 --kinds {kind} --seed {seed} --report -",
    }
