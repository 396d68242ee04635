"""A sink's stuck committer and its operator's resumes, in the log: every process and replica sees and follows them.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29

A commit that no retry can fix sticks the sink's committer until an operator resumes it. That state lived in the
process whose commit failed: with several serving processes (or replicas), `GET /api/v1/sinks/{sink}` answered by
another said `idle` or `healthy`, and `POST .../resume` resumed only the process it reached. The log now records why
the sink is stuck, and counts the resumes: a stuck committer resumes when the count passes the one it stuck at.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds columns with defaults: code at 0006 runs on it


def upgrade() -> None:
    op.add_column("sinks", sa.Column("committer_stuck_reason", sa.Text(), nullable=True))
    op.add_column("sinks", sa.Column("committer_stuck_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("sinks", sa.Column("resumes", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("sinks", "resumes")
    op.drop_column("sinks", "committer_stuck_at")
    op.drop_column("sinks", "committer_stuck_reason")
