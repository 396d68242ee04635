"""When a sink's writer last called the coordinator, as any replica saw it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25

The admin API, the console, `sink-coordinator status` and the metrics show the writer's liveness from it (issue
26.5): a writer that died leaves its sink's other columns as they were. Each replica records the calls it answered
in the background, a few seconds at a time (coordinator_service.engine.writer_calls), so that no writer call waits
for it.
NULL: no writer called since the column exists.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds: code at 0006 runs on it


def upgrade() -> None:
    op.add_column("sinks", sa.Column("writer_last_call_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("sinks", "writer_last_call_at")
