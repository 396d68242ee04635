"""Create sinks and pending_sink_state.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sinks",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.Text(), nullable=False, unique=True),
        sa.Column("table_identifier", sa.Text(), nullable=False),
        sa.Column("catalog", sa.Text(), nullable=False),
        sa.Column("checkpointed_epoch", sa.BigInteger(), nullable=False, server_default="-1"),
        sa.Column("committed_epoch", sa.BigInteger(), nullable=False, server_default="-1"),
        sa.Column("writer_term", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("writer_count", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("committed_epoch <= checkpointed_epoch", name="committed_not_after_checkpoint"),
        sa.CheckConstraint("writer_count >= 1", name="writer_count_positive"),
    )
    op.create_table(
        "pending_sink_state",
        sa.Column("sink_id", sa.Integer(), sa.ForeignKey("sinks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column(
            "status",
            sa.Enum("PENDING", "COMMITTED", "ABORTED", name="epoch_status"),
            nullable=False,
        ),
        sa.Column("metadata", sa.LargeBinary(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("record_count", sa.BigInteger(), nullable=False),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("files_cleaned", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("sink_id", "epoch"),
        sa.CheckConstraint("epoch >= 0", name="epoch_not_negative"),
    )
    op.create_index("ix_pending_sink_state_sink_status_epoch", "pending_sink_state", ["sink_id", "status", "epoch"])


def downgrade() -> None:
    op.drop_index("ix_pending_sink_state_sink_status_epoch", table_name="pending_sink_state")
    op.drop_table("pending_sink_state")
    op.drop_table("sinks")
    sa.Enum(name="epoch_status").drop(op.get_bind(), checkfirst=False)
