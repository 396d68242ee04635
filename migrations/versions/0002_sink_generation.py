"""Add sinks.generation and sinks.rebase_on_register for the operator reset.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28

Existing sinks start at generation 0, which is also what the snapshot markers
written before this revision (they carry no generation) count as.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sinks", sa.Column("generation", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("sinks", sa.Column("rebase_on_register", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("sinks", "rebase_on_register")
    op.drop_column("sinks", "generation")
