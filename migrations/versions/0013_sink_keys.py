"""A sink's key: the columns of an upsert or change stream's key (issue 29), fixed when the sink is created.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

RegisterWriter records the key a new sink's writer names (its tables are created keyed by it) and refuses a later
writer that names another key, or none: a sink's key never changes silently (docs/architecture.md, "Row mutations:
position deletes resolved at commit"). Empty: an append stream, as every sink before this revision is.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds a column with a default: code at 0006 runs on it


def upgrade() -> None:
    op.add_column(
        "sinks",
        sa.Column("key_columns", postgresql.ARRAY(sa.Text()), nullable=False, server_default=sa.text("'{}'::text[]")),
    )


def downgrade() -> None:
    op.drop_column("sinks", "key_columns")
