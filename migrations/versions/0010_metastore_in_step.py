"""Whether the log is in step with the tables: a sink suspended when it is not, and each table's UUID.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25

* sinks.suspended_reason: set when the coordinator finds the log out of step with a table of the sink (a metastore
  restored to an earlier point: a table holds epochs above the log's checkpoint; a table that is not the one
  recorded; a sink created in another catalog). Nothing is committed or accepted for the sink while it is set.
* sink_tables.table_uuid: the UUID of the table the sink writes, recorded at its first check.

Additions only: a release before this one keeps working beside it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds: code at 0006 runs on it


def upgrade() -> None:
    op.add_column("sinks", sa.Column("suspended_reason", sa.Text(), nullable=True))
    op.add_column("sink_tables", sa.Column("table_uuid", sa.Uuid(), nullable=True))


def downgrade() -> None:
    op.drop_column("sink_tables", "table_uuid")
    op.drop_column("sinks", "suspended_reason")
