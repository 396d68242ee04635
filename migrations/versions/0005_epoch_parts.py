"""The parts of multi-writer epochs, kept in the metastore until every writer sent its own.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

A sink with writer_count > 1 gathers each epoch's parts (one per writer) here, so that writers whose calls
reach different coordinator replicas still complete the epoch.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "epoch_parts",
        sa.Column("sink_id", sa.Integer(), sa.ForeignKey("sinks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("writer_id", sa.Integer(), nullable=False),
        sa.Column("writer_term", sa.BigInteger(), nullable=False),
        sa.Column("metadata", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("sink_id", "epoch", "writer_id"),
    )


def downgrade() -> None:
    op.drop_table("epoch_parts")
