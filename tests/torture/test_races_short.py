"""The races of issue 23 in the suite: one seeded run of each kind (python -m tests.torture.races for more)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.torture.races import KINDS
from tests.torture.races.run import race

SEEDS = (7,)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", KINDS)
async def test_race(kind: str, seed: int, postgres_url: str, tmp_path: Path) -> None:
    result = await race(kind, seed, postgres_url, tmp_path)
    assert not result["anomalies"], f"replay with `{result['replay']}`:\n" + "\n".join(result["anomalies"])
