"""Console sessions ended by their operator, until their cookies would have expired anyway.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25

The console's session cookie is signed, not stored: signing out records the session's id here, and every
replica refuses a cookie of a session recorded here (docs/operations.md, "Threat model"). A row is useless once
the cookie's own lifetime is over (expires_at), and goes at the next sign-out.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds: code at 0006 runs on it


def upgrade() -> None:
    op.create_table(
        "console_sign_outs",
        sa.Column("session_id", sa.Text(), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("console_sign_outs")
