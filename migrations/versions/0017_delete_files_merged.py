"""How many position delete files a maintenance run merged.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28

Compaction merges a partition's position delete files into one (a keyed table's updates and deletes: issue 29), which
rewrites no data file: a run's record says how many it merged, beside the data files it rewrote.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds a column with a default: code at 0006 runs on it


def upgrade() -> None:
    op.add_column(
        "maintenance_runs", sa.Column("delete_files_merged", sa.Integer(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    op.drop_column("maintenance_runs", "delete_files_merged")
