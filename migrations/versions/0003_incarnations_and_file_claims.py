"""Sink incarnations, abort causes and times, and the data files each epoch holds.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

* sinks.incarnation: a UUID created with the row. Every snapshot marker carries
  it, so a sink created again under an old name (a recreated or restored
  metastore, a deleted row) never takes an earlier incarnation's markers as its
  own. Rows that exist now get one too, and legacy_markers = true: the markers
  they wrote before this revision carry no incarnation and still count as
  theirs. Rows created later have legacy_markers = false and ignore such markers.
* pending_sink_state.abort_cause and aborted_at: why and when an epoch was
  aborted, which decides how long the cleaner keeps its files. Existing ABORTED
  rows get them from their reason and their last update.
* epoch_files: every data file path an epoch holds (one epoch of one sink per
  path), and the files of replaced attempts waiting for the cleaner
  (discarded_at). Filled from the pre-commit records of the rows that exist now.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ABORT_CAUSE = postgresql.ENUM("RECOVERY", "OPERATOR", "RESET", name="abort_cause", create_type=False)


def upgrade() -> None:
    op.add_column(
        "sinks",
        sa.Column("incarnation", sa.Uuid(), nullable=False, server_default=sa.text("gen_random_uuid()")),
    )
    op.add_column("sinks", sa.Column("legacy_markers", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute("UPDATE sinks SET legacy_markers = true")
    op.create_unique_constraint("uq_sinks_incarnation", "sinks", ["incarnation"])

    ABORT_CAUSE.create(op.get_bind(), checkfirst=False)
    op.add_column("pending_sink_state", sa.Column("abort_cause", ABORT_CAUSE, nullable=True))
    op.add_column("pending_sink_state", sa.Column("aborted_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        """
        UPDATE pending_sink_state SET aborted_at = updated_at,
            abort_cause = CASE WHEN reason LIKE 'recovery:%' THEN 'RECOVERY'::abort_cause
                               WHEN reason LIKE 'reset by %' THEN 'RESET'::abort_cause
                               ELSE 'OPERATOR'::abort_cause END
        WHERE status = 'ABORTED'
        """
    )
    op.create_check_constraint(
        "abort_cause_iff_aborted",
        "pending_sink_state",
        "(status = 'ABORTED') = (abort_cause IS NOT NULL AND aborted_at IS NOT NULL)",
    )

    op.create_table(
        "epoch_files",
        sa.Column("path", sa.Text(), primary_key=True),
        sa.Column("sink_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("discarded_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["sink_id", "epoch"],
            ["pending_sink_state.sink_id", "pending_sink_state.epoch"],
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_epoch_files_sink_epoch", "epoch_files", ["sink_id", "epoch"])
    op.create_index(
        "ix_epoch_files_discarded",
        "epoch_files",
        ["discarded_at"],
        postgresql_where=sa.text("discarded_at IS NOT NULL"),
    )
    op.execute(
        """
        INSERT INTO epoch_files (path, sink_id, epoch, attempt)
        SELECT DISTINCT ON (file ->> 'path') file ->> 'path', p.sink_id, p.epoch, p.attempt
        FROM pending_sink_state p,
             jsonb_array_elements(convert_from(p.metadata, 'UTF8')::jsonb -> 'tables') AS t(document),
             jsonb_array_elements(t.document -> 'data_files') AS f(file)
        WHERE NOT (p.status = 'ABORTED' AND p.files_cleaned)
        ORDER BY file ->> 'path', p.updated_at DESC
        ON CONFLICT (path) DO NOTHING
        """
    )


def downgrade() -> None:
    op.drop_index("ix_epoch_files_discarded", table_name="epoch_files")
    op.drop_index("ix_epoch_files_sink_epoch", table_name="epoch_files")
    op.drop_table("epoch_files")
    op.drop_constraint("abort_cause_iff_aborted", "pending_sink_state", type_="check")
    op.drop_column("pending_sink_state", "aborted_at")
    op.drop_column("pending_sink_state", "abort_cause")
    ABORT_CAUSE.drop(op.get_bind(), checkfirst=False)
    op.drop_constraint("uq_sinks_incarnation", "sinks", type_="unique")
    op.drop_column("sinks", "legacy_markers")
    op.drop_column("sinks", "incarnation")
