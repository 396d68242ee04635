"""Table maintenance: per-sink overrides of its settings, and the record of its runs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sinks", sa.Column("maintenance_overrides", postgresql.JSONB(), nullable=True))
    op.create_table(
        "maintenance_runs",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("sink_id", sa.Integer(), sa.ForeignKey("sinks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False, server_default="running"),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("snapshots_expired", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("expired_files_deleted", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("files_compacted", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("files_written", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("bytes_rewritten", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("swept", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("orphans_deleted", sa.Integer(), nullable=False, server_default="0"),
        sa.CheckConstraint("trigger IN ('schedule', 'operator')", name="maintenance_trigger_known"),
        sa.CheckConstraint("outcome IN ('running', 'ok', 'failed')", name="maintenance_outcome_known"),
    )
    op.create_index("ix_maintenance_runs_sink_started", "maintenance_runs", ["sink_id", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_maintenance_runs_sink_started", table_name="maintenance_runs")
    op.drop_table("maintenance_runs")
    op.drop_column("sinks", "maintenance_overrides")
