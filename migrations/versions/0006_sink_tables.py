"""The tables of a sink (fan-out): per sink and table, the newest epoch that table holds.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

* sink_tables: one row per table a sink writes, its own table (sinks.table_identifier) among them, with
  committed_epoch: the newest epoch whose files of that table the table holds, every epoch below it included.
  Every existing sink gets its own table's row, at its committed epoch.
* A trigger keeps every table of a sink at or above the sink's committed_epoch, whatever statement moves it: a
  COMMITTED epoch is in every table that has files of it, and an epoch without files in a table is in it
  trivially. So the sink's committed_epoch is never above the least of its tables' (the committer moves the
  tables' and the sink's together, making it that least; see docs/architecture.md, "Fan-out").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sink_tables",
        sa.Column("sink_id", sa.Integer(), sa.ForeignKey("sinks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("table_identifier", sa.Text(), nullable=False),
        sa.Column("committed_epoch", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("sink_id", "table_identifier"),
    )
    op.execute(
        "INSERT INTO sink_tables (sink_id, table_identifier, committed_epoch) "
        "SELECT id, table_identifier, committed_epoch FROM sinks"
    )
    op.execute(
        """
        CREATE FUNCTION sink_tables_follow_sink() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE sink_tables SET committed_epoch = NEW.committed_epoch, updated_at = now()
            WHERE sink_id = NEW.id AND committed_epoch < NEW.committed_epoch;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER sink_tables_follow_sink AFTER UPDATE OF committed_epoch ON sinks
        FOR EACH ROW WHEN (NEW.committed_epoch > OLD.committed_epoch) EXECUTE FUNCTION sink_tables_follow_sink()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER sink_tables_follow_sink ON sinks")
    op.execute("DROP FUNCTION sink_tables_follow_sink()")
    op.drop_table("sink_tables")
