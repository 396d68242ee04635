"""Where verification of each of a sink's tables stands.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28

`sink-coordinator verify`, the admin API's POST /api/v1/sinks/{sink}/verify and the verification maintenance step
(issue 31) prove that a sink's tables hold what its topics held in the committed range
(coordinator_service.engine.verification). Each table's row says how far that proof reached (the newest snapshot,
the sink's newest epoch, the sink's end offsets), so that the next verification reads only what came after, and
what the last one found. A sink's deletion takes its rows with it.

Only a new table: a release before this one keeps working beside it (it never reads the table).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds: code at 0006 runs on it


def upgrade() -> None:
    op.create_table(
        "sink_verifications",
        sa.Column("sink_id", sa.Integer(), sa.ForeignKey("sinks.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("table_identifier", sa.Text(), primary_key=True),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=True),
        sa.Column("verified_epoch", sa.BigInteger(), nullable=False),
        sa.Column("end_offsets", JSONB(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("faults", JSONB(), nullable=False),
        sa.Column("notes", JSONB(), nullable=False),
        sa.Column("deep", sa.Boolean(), nullable=False),
        sa.Column("kafka", sa.Boolean(), nullable=False),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("outcome IN ('ok', 'failed')", name="verification_outcome_known"),
    )


def downgrade() -> None:
    op.drop_table("sink_verifications")
