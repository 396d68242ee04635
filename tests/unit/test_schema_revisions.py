"""What docs/operations.md ('Upgrades and rollbacks') says of the schema revisions is what the migrations declare: the
revisions the release before runs on are the ones up to the head, each expanding (declaring that release's head the
oldest compatible code), and the rollback drops what they added. A revision to migrate to is head or one of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator_service.log import schema

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_runbook_names_every_revision_the_release_before_runs_on() -> None:
    text = OPERATIONS.read_text()
    found = re.search(r"Revisions (\d{4}) to (\d{4}) are all expanding: the 0\.1 release's code \(head (\d{4})\)", text)
    assert found, "docs/operations.md no longer says which revisions are expanding"
    first, last, release_head = found.groups()
    assert last == schema.head_revision()
    assert first == f"{int(release_head) + 1:04d}"
    assert schema.oldest_compatible_code(last) == release_head
    assert f"(for {first} to {last}: " in text, "the rollback's list of what is dropped names other revisions"


# The revisions as the migration files name them (NNNN_what.py), read independently of Alembic.
ON_DISK = frozenset(
    path.name[:4] for path in (Path(__file__).resolve().parents[2] / "migrations" / "versions").glob("[0-9]*.py")
)


@given(st.one_of(st.sampled_from(sorted(ON_DISK | {"head"})), st.text(max_size=30)))
def test_a_target_is_taken_only_when_it_is_head_or_a_revision_of_this_release(target: str) -> None:
    if target == "head" or target in ON_DISK:
        schema.check_target(target)
    else:
        with pytest.raises(ValueError, match="this release knows no schema revision"):
            schema.check_target(target)
